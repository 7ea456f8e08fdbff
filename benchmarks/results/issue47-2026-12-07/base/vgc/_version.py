"""vgc's version: its own module, so that code below the package root can read it without importing the package."""

__version__ = "0.1.0"
