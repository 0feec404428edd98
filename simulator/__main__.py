"""`python -m simulator`: a llama-server twin (see simulator/cli.py)."""

from simulator.cli import main

raise SystemExit(main())
