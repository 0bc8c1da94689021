from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_scheduling", "0004_scheduler_instances"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="taskrun",
            index=models.Index(
                fields=["task_name", "status", "started_at"], name="ds_run_task_status_started"
            ),
        ),
    ]
