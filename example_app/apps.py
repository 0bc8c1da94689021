from django.apps import AppConfig


class ExampleAppConfig(AppConfig):
    name = "example_app"
    default_auto_field = "django.db.models.BigAutoField"
