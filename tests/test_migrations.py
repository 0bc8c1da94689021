"""The migrations match the models on every Django of the matrix: a new project migrates to
exactly the tables the code expects."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command
from django.test import TestCase


class MigrationTests(TestCase):
    def test_the_models_need_no_new_migration(self) -> None:
        output = StringIO()
        try:
            call_command(
                "makemigrations", "django_scheduling", check=True, dry_run=True, stdout=output
            )
        except SystemExit:
            self.fail(f"makemigrations would write a migration:\n{output.getvalue()}")
