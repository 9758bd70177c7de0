"""dblock on a SQLAlchemy engine: the pool lent, the lock tables as metadata."""
