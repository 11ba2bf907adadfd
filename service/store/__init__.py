"""The store: the only code that talks SQL. Functions take a Session and keyword arguments and
return pydantic schemas; ORM rows never leave this package."""

from curvecast.service.store import metrics, projects, runs, tokens

__all__ = ["metrics", "projects", "runs", "tokens"]
