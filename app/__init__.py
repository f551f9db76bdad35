"""Glassbox application: the GUI, the command line, and the wiring of engine and rag."""
