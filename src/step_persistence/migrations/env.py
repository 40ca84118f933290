"""Alembic environment for step-persistence (command line and programmatic use)."""

from step_persistence.migrations.environment import run_environment

run_environment()
