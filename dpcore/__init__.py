"""dpcore: the differential-privacy library behind geodp.

Pure functions and small classes with numpy arrays in and out. No Prefect, no Dask, no global
state: a researcher can use it alone. See README.md and docs/architecture.md for the map.
"""

__version__ = "0.1.0"


class GeoDPError(Exception):
    """Base class of every error geodp raises on purpose (bad input, refused release, ...)."""
