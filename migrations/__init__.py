"""Alembic home: the only place curvecast's database schema is created or changed."""
