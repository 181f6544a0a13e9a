"""geodp for analysts: open a release store (a folder or ``s3://bucket/prefix``), list its releases and
query them into pandas DataFrames or xarray arrays. Every file is checked against its manifest's sha256
before use, as the ``geodp query`` command does. Reading releases spends no privacy budget.

    >>> import geodp
    >>> store = geodp.open_store("geodp-store")
    >>> release = store.latest("checkins", "new-york", "2024-01-01")
    >>> release.query([(40.70, -74.02, 40.72, -74.00)])        # estimate, lower, upper, unit, ...

See docs/python-api.md.
"""

from geodp.api import Release, Store, open_store

__all__ = ["Release", "Store", "open_store"]
