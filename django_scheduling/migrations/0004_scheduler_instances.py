from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_scheduling", "0003_enqueued_runs"),
    ]

    operations = [
        migrations.CreateModel(
            name="SchedulerInstance",
            fields=[
                (
                    "name",
                    models.CharField(
                        max_length=255, primary_key=True, serialize=False, verbose_name="name"
                    ),
                ),
                ("host", models.CharField(max_length=255, verbose_name="host")),
                ("pid", models.PositiveIntegerField(verbose_name="process id")),
                ("started_at", models.DateTimeField(verbose_name="started at")),
                ("last_seen", models.DateTimeField(verbose_name="last seen")),
            ],
            options={
                "verbose_name": "scheduler instance",
                "verbose_name_plural": "scheduler instances",
                "ordering": ["-last_seen", "name"],
            },
        ),
    ]
