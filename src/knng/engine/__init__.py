"""The single-device engine: tile plans, the screening pass, merges and the exact certificate."""
