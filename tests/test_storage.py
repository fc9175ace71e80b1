"""Results over the platform's size limit: uploaded to S3 (moto) or refused with a clear code."""

from __future__ import annotations

import json
import logging

import boto3
import pytest
from moto import mock_aws

from handler.errors import Code
from handler.pipeline.job import run_job
from handler.pipeline.runtime import Runtime
from tests.helpers import DATA, b64, make_settings

pytestmark = pytest.mark.model


@pytest.fixture
def aws(monkeypatch):
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        boto3.client("s3").create_bucket(Bucket="results")
        yield


JOB = {"audio_base64": b64(DATA / "jfk.wav"), "output": ["text", "segments", "srt", "vtt"]}


def test_small_result_stays_inline(tiny_pool, aws):
    w = Runtime(settings=make_settings(device="cpu", result_bucket="results"), pool=tiny_pool)
    result = run_job(JOB, w)
    assert "result_url" not in result and result["srt"]


def test_large_result_without_bucket_is_refused(tiny_pool):
    w = Runtime(settings=make_settings(device="cpu", max_result_bytes=500), pool=tiny_pool)
    result = run_job(JOB, w)
    assert result["error_code"] == Code.RESULT_TOO_LARGE
    assert "WHISPER_RESULT_BUCKET" in result["error"]


def test_large_result_goes_to_s3(tiny_pool, aws, caplog):
    caplog.set_level(logging.INFO)  # the worker's level (botocore logs signatures at DEBUG)
    settings = make_settings(device="cpu", max_result_bytes=500, result_bucket="results")
    result = run_job(JOB, Runtime(settings=settings, pool=tiny_pool), job_id="job-42")
    assert "error" not in result, result
    assert result["result_url"].startswith("https://") and result["result_bytes"] > 500
    assert result["language"] == "en" and "srt" not in result
    body = boto3.client("s3").get_object(Bucket="results", Key="results/job-42.json")["Body"]
    full = json.loads(body.read())
    assert "ask not what your country" in full["text"] and full["vtt"].startswith("WEBVTT")
    query = result["result_url"].split("?", 1)[1]
    assert query not in caplog.text and "Signature" not in caplog.text
