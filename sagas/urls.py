from django.urls import path

from sagas import api

urlpatterns = [
    path("sagas", api.SagaListView.as_view(), name="saga-list"),
    path("sagas/<str:saga_id>", api.SagaDetailView.as_view(), name="saga-detail"),
]
