from django.urls import path

from approvals import api

urlpatterns = [
    path("approvals", api.RequestListView.as_view(), name="approvals"),
    path("approvals/policies", api.PolicyListView.as_view(), name="approval-policies"),
    path("approvals/policies/<id:policy_id>", api.PolicyDetailView.as_view(), name="approval-policy"),
    path("approvals/break-glass", api.BreakGlassListView.as_view(), name="approvals-break-glass"),
    path("approvals/<str:approval_id>", api.RequestDetailView.as_view(), name="approval"),
    path("approvals/<str:approval_id>/votes", api.VoteView.as_view(), name="approval-votes"),
    path("approvals/<str:approval_id>/challenge", api.ChallengeView.as_view(), name="approval-challenge"),
    path("approvals/<str:approval_id>/wait", api.WaitView.as_view(), name="approval-wait"),
]
