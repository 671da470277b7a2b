"""The command line: ``memwal <command>``. ``app`` parses and dispatches, ``commands`` runs
each command, ``terminal`` draws live views, ``render`` turns typed records into text or
JSON, ``files`` reads user files (Parquet, Arrow IPC, CSV, JSON lines)."""

from memwal.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
