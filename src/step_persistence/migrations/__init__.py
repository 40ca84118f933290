"""step-persistence's Alembic migrations, shipped in the package.

`script_location = step_persistence:migrations` (Alembic's package-resource form) finds them in
an installed wheel; the repository's top-level `alembic.ini` points here too. `env.py` defers to
`step_persistence.migrations.environment`, which serves both `alembic upgrade head` and
`await store.migrate()`.
"""
