"""``python -m proxy.cli``: the ``mtp-proxy`` command."""

import sys

from proxy.cli.main import main

sys.exit(main())
