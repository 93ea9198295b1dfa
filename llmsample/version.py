"""The package's version, apart from the package's root so that what the root exposes lazily
(``llmsample.Engine``) and what reads the version import nothing of each other."""

__version__ = "0.1.0"
