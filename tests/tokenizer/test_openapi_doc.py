"""/openapi.json lists every route: FastAPI's and those served in front of it."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

from services.tokenizer.openapi_doc import document_post_routes
from services.tokenizer.post_routes import PostRoute


class Inner(BaseModel):
    n: int = 1


class Body(BaseModel):
    prompt: str
    inner: Inner = Inner()


async def _never(*_):  # the schema only: PostRoutes serves these paths before FastAPI
    raise AssertionError


def test_post_routes_join_fastapis_schema() -> None:
    app = FastAPI(title="t")

    @app.get("/health")
    async def health() -> dict:
        return {}

    document_post_routes(
        app, {"/v1/x": PostRoute(Body, _never, "X it"), "/raw": PostRoute(None, _never, "", documented=Inner)}
    )
    schema = app.openapi()
    assert set(schema["paths"]) == {"/health", "/v1/x", "/raw"}
    x = schema["paths"]["/v1/x"]["post"]
    assert x["summary"] == "X it" and x["operationId"] == "post_v1_x"
    assert x["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Body"}
    comps = schema["components"]["schemas"]
    assert comps["Body"]["properties"]["inner"]["$ref"] == "#/components/schemas/Inner" and "Inner" in comps
    assert schema["paths"]["/raw"]["post"]["summary"] == "/raw"
    assert app.openapi() is schema  # built once
