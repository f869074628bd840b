from django.urls import path

from slackapp import views

urlpatterns = [
    path("interactions", views.interactions, name="slack-interactions"),
    path("commands", views.commands, name="slack-commands"),
    path("events", views.events, name="slack-events"),
]
