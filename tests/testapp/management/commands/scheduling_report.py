"""A management command that the tests schedule: it writes to stdout and stderr, and fails
when asked to."""

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Write a report line per --count to stdout, a note to stderr; --fail raises."

    def add_arguments(self, parser):
        parser.add_argument("label")
        parser.add_argument("--count", type=int, default=1)
        parser.add_argument("--fail", action="store_true")

    def handle(self, *args, label, count, fail, **options):
        for number in range(1, count + 1):
            self.stdout.write(f"{label} line {number}")
        self.stderr.write(f"{label}: {count} line(s) written")
        if fail:
            raise CommandError(f"{label} could not finish")
