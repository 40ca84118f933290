"""Alembic environment for `alembic upgrade head` in a checkout or deployment.

The logic lives in the package (`step_persistence.migrations.environment`), shared with the
packaged `env.py` that `await store.migrate()` runs, so the command line and programmatic
upgrades behave the same.
"""

from step_persistence.migrations.environment import run_environment

run_environment()
