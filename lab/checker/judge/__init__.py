"""The single judge: runs the registry's rules, qualifies them, and gives the run's verdict."""
