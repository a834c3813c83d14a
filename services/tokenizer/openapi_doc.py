"""/openapi.json (and /docs) for every route, those served outside FastAPI too.

The routes that generate are matched in plain ASGI before FastAPI (post_routes.py), so
FastAPI's generated schema knows nothing of them. Its schema is extended here, once, with a
POST operation for each: the body's JSON schema (pydantic's) as the request body, its
nested models among the components."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from services.tokenizer.post_routes import PostRoute

REF = "#/components/schemas/{model}"


def document_post_routes(app: FastAPI, routes: dict[str, PostRoute]) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for path, route in sorted(routes.items()):
                schema["paths"].setdefault(path, {})["post"] = _operation(path, route, components)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _operation(path: str, route: PostRoute, components: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": route.summary or path,
        "operationId": "post_" + (path.strip("/").replace("/", "_") or "root"),
        "responses": {
            "200": {"description": "the generation: JSON, or server-sent events when it streams"},
            "400": {"description": "a bad request, the problem named"},
            "422": {"description": "a body that does not validate"},
        },
    }
    model = route.body or route.documented
    if model is not None:
        body = model.model_json_schema(ref_template=REF)
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        ref = {"$ref": REF.format(model=model.__name__)}
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    return op
