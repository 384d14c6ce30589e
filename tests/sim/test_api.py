"""The OpenAI-compatible API in-process: shapes, lengths and the error bodies vLLM answers with."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.sim.inprocess import inprocess_sim


def chat(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "test-model", "messages": [{"role": "user", "content": content}], **extra}


def test_info_endpoints_look_like_vllm() -> None:
    async def go() -> None:
        async with inprocess_sim(served_model_names=["alias-a", "alias-b"]) as sim:
            assert (await sim.client.get("/health")).status_code == 200
            assert (await sim.client.get("/version")).json() == {"version": "0.33.0"}
            models = (await sim.client.get("/v1/models")).json()
            assert models["object"] == "list"
            assert [m["id"] for m in models["data"]] == ["alias-a", "alias-b"]
            assert all(m["owned_by"] == "vllm" and m["max_model_len"] == 2048 for m in models["data"])
    asyncio.run(go())


def test_unknown_paths_and_methods_answer_as_vllm_does() -> None:
    async def go() -> None:
        async with inprocess_sim() as sim:
            missing = await sim.client.get("/v1/embeddings-nope")
            assert missing.status_code == 404 and missing.json() == {"detail": "Not Found"}
            wrong = await sim.client.get("/v1/completions")
            assert wrong.status_code == 405 and wrong.json() == {"detail": "Method Not Allowed"}
            assert wrong.headers["allow"] == "POST"
    asyncio.run(go())


def test_completion_lengths_follow_max_tokens_and_ignore_eos() -> None:
    async def go() -> None:
        async with inprocess_sim() as sim:
            r = await sim.client.post("/v1/completions", json={"model": "test-model", "prompt": "x" * 40,
                                                               "max_tokens": 7, "ignore_eos": True})
            body = r.json()
            assert r.status_code == 200 and body["object"] == "text_completion"
            assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17,
                                     "prompt_tokens_details": None}
            assert body["choices"][0]["finish_reason"] == "length"
            reasons = set()
            for _ in range(6):
                r = await sim.client.post("/v1/chat/completions", json=chat(max_completion_tokens=40))
                b = r.json()
                n = b["usage"]["completion_tokens"]
                assert 1 <= n <= 40
                assert b["choices"][0]["finish_reason"] == ("length" if n == 40 else "stop")
                assert b["choices"][0]["message"]["role"] == "assistant"
                reasons.add(b["choices"][0]["finish_reason"])
            assert "stop" in reasons  # without ignore_eos answers end on their own
    asyncio.run(go())


def test_bad_requests_get_vllm_error_bodies() -> None:
    async def go() -> None:
        async with inprocess_sim() as sim:
            post = sim.client.post
            cases = [
                (await post("/v1/chat/completions", json={**chat(), "model": "nope"}), 404, "NotFoundError"),
                (await post("/v1/chat/completions", json={"model": "test-model"}), 400, "BadRequestError"),
                (await post("/v1/completions", json={"model": "test-model"}), 400, "BadRequestError"),
                (await post("/v1/completions", json={"model": "test-model", "prompt": "x" * 9000}), 400,
                 "BadRequestError"),
                (await post("/v1/completions", json={"model": "test-model", "prompt": "x" * 4000,
                                                     "max_tokens": 2000}), 400, "BadRequestError"),
                (await post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}),
                 400, "BadRequestError"),
            ]
            for response, status, kind in cases:
                assert response.status_code == status, response.text
                error = response.json()["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["type"] == kind and error["code"] == status and error["message"]
            too_long = cases[3][0].json()["error"]["message"]
            assert "maximum context length is 2048 tokens" in too_long
            assert sim.ctx.engine.in_flight == 0
    asyncio.run(go())


def test_draining_server_refuses_new_work_but_stays_healthy() -> None:
    async def go() -> None:
        async with inprocess_sim() as sim:
            sim.ctx.draining = True
            r = await sim.client.post("/v1/chat/completions", json=chat())
            assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
            assert (await sim.client.get("/health")).status_code == 200
    asyncio.run(go())


def test_dead_engine_turns_health_503_and_fails_requests() -> None:
    async def go() -> None:
        async with inprocess_sim() as sim:
            pending = asyncio.create_task(sim.client.post("/v1/chat/completions",
                                                          json=chat(max_tokens=500, ignore_eos=True)))
            await asyncio.sleep(0.05)
            sim.ctx.engine.kill("boom")
            assert (await pending).status_code == 500
            assert (await sim.client.get("/health")).status_code == 503
            assert (await sim.client.post("/v1/chat/completions", json=chat())).status_code == 500
    asyncio.run(go())
