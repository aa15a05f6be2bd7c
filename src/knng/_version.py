"""knng's version, in a leaf module so that every layer can name it (checkpoint fingerprints)."""

VERSION = "0.1.0"
