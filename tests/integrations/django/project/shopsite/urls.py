from __future__ import annotations

from django.urls import path
from shop import views

urlpatterns = [
    path("reserve/<str:sku>/", views.reserve),
    path("report/<str:name>/", views.report),
]
