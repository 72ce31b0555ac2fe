"""Configuration: the TOML file, run-time settings, upstream targets, preflight checks."""
