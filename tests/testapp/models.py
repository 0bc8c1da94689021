from django.db import models


class Execution(models.Model):
    """One call of a test task, written by the task itself."""

    task = models.CharField(max_length=100)
    fire_time = models.DateTimeField(null=True)
    pid = models.IntegerField()
    started = models.DateTimeField()
    finished = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"{self.task} for {self.fire_time}"
