"""Reports of analysis result directories: seaborn figures and HTML/Markdown/CSV/JSON export."""

from fi_toolkit.report.export import FORMATS, build_report, load_run, parse_formats

__all__ = ["FORMATS", "build_report", "load_run", "parse_formats"]
