"""Tables and files for people."""
