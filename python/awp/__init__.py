"""AWP (AI Workload Platform): the database is the platform; this package is the thin shell."""

__version__ = "0.1.0"
