"""Support for the multi-host tests: simulated hosts (network namespaces) and scheduler stand-ins."""
