"""A llama-server twin whose speed and acceptance follow a calibrated model of MTP decoding."""
