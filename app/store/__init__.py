"""The only package that speaks Redis: one module per plane, keys built in ``keys``."""
