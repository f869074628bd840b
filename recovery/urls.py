from django.urls import path

from recovery import api

urlpatterns = [
    path("recovery/claim", api.ClaimView.as_view(), name="recovery-claim"),
    path("recovery/results", api.ResultsView.as_view(), name="recovery-results"),
    path("recovery/jobs", api.JobListView.as_view(), name="recovery-jobs"),
    path("recovery/jobs/<str:job_id>/complete", api.CompleteView.as_view(), name="recovery-job-complete"),
    path("recovery/jobs/<str:job_id>/fail", api.FailView.as_view(), name="recovery-job-fail"),
    path("recovery/jobs/<str:job_id>/heartbeat", api.HeartbeatView.as_view(), name="recovery-job-heartbeat"),
    path("recovery/jobs/<str:job_id>/retry", api.RetryView.as_view(), name="recovery-job-retry"),
    path("recovery/jobs/<str:job_id>/resolve", api.ResolveView.as_view(), name="recovery-job-resolve"),
    path("recovery/jobs/<str:job_id>/assign", api.AssignView.as_view(), name="recovery-job-assign"),
    path("recovery/webhook", api.WebhookView.as_view(), name="recovery-webhook"),
    path("sagas/<str:saga_id>/rollback", api.RollbackView.as_view(), name="saga-rollback"),
]
