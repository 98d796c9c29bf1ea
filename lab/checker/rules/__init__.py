"""The rules (gates and checks), one module each, and the registry that lists them."""
