"""Refusal: one type for what gpulease refuses, with one rendering (gpulease/core/refusal.py)."""

from __future__ import annotations

import pytest

from gpulease.core.billing.rules import BillingError
from gpulease.core.model.profiles import ProfileError
from gpulease.core.policy.limits import LimitError
from gpulease.core.policy.options import OptionsRefused
from gpulease.core.refusal import FieldError, Refusal
from gpulease.hub.service.activity_store import PushError
from gpulease.hub.service.billing_views import PeriodError
from gpulease.hub.service.errors import APIError
from gpulease.spawners.http_error import http_error
from gpulease.spawners.queueing.runner import Refused
from gpulease.store.accounts import AccountError
from gpulease.store.notices import NoticeError

KINDS = [
    (OptionsRefused(422, "no such profile", [FieldError("profile", "no such profile")]), 422),
    (Refused(409, "over the limit"), 409),
    (LimitError("bad", [("max_gpus", "must be a whole number")]), 400),
    (NoticeError("kind", "unknown kind"), 400),
    (BillingError(402, "not enough credit", "account"), 402),
    (PushError(403, "not a server's token", [("token", "a user's")]), 403),
    (PeriodError("since", "not a date"), 400),
    (AccountError("a name is 1-30 characters"), 400),
    (ProfileError([FieldError("gpu.mig", "unknown"), FieldError("price", "negative")]), 400),
    (APIError(429, "too often", [{"field": "", "message": "too often"}],
              headers={"Retry-After": "2"}), 429),
]


@pytest.mark.parametrize("refusal, status", KINDS, ids=lambda k: type(k).__name__)
def test_every_kind_is_one_refusal_with_status_message_and_fields(refusal, status):
    assert isinstance(refusal, Refusal)
    body = refusal.body()
    assert body["status"] == refusal.status == status
    assert body["message"] == refusal.message == str(refusal) and refusal.message
    assert all(set(e) == {"field", "message"} for e in body["errors"])
    assert [tuple(e.values()) for e in body["errors"]] == [tuple(e) for e in refusal.errors]


def test_field_errors_unpack_as_pairs_and_compare_with_them():
    e = LimitError("bad", [("max_gpus", "must be a whole number")])
    [(field, message)] = e.errors
    assert (field, message) == ("max_gpus", "must be a whole number") == e.errors[0]
    assert e.field == "max_gpus" and Refusal("no field").field == ""
    assert str(FieldError("gpu.mig", "m")) == "gpu.mig: m" and str(FieldError("", "m")) == "m"


def test_under_names_fields_inside_an_object_and_keeps_the_whole_one():
    refused = OptionsRefused(400, "unknown key", [FieldError("gpu", "unknown"),
                                                  FieldError("user_options", "not an object")])
    moved = refused.under("user_options", whole="user_options")
    assert [e.field for e in moved.errors] == ["user_options.gpu", "user_options"]
    assert (moved.status, moved.message) == (400, "unknown key")


def test_http_error_is_what_jupyterhub_answers_with():
    refused = Refused(503, "No free 1g.18gb slice, and the queue is full (100%)")
    error = http_error(refused)
    assert error.status_code == 503
    assert error.log_message % error.args == refused.message  # a % in it stays as it is
    assert error.gpulease_refusal is refused
