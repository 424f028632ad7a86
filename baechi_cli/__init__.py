"""baechi: a placement compiler for machine-learning operator graphs."""

__version__ = "0.1.0"
