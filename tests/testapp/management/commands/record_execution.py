"""A management command that the tests schedule from settings and from the database: it
records the fire time it serves, as the test tasks do."""

from django.core.management.base import BaseCommand

from tests.testapp.tasks import record


class Command(BaseCommand):
    help = "Record an execution of LABEL for the fire time being served."

    def add_arguments(self, parser):
        parser.add_argument("label")

    def handle(self, *args, label, **options):
        record(label)
        self.stdout.write(f"recorded {label}")
