"""The committed openapi/openapi.json is a valid OpenAPI 3.1 document (openapi-spec-validator)."""

import importlib

from tests.clients.toolchain import ensure_pip_package, spec


def test_committed_spec_passes_openapi_spec_validator() -> None:
    ensure_pip_package("openapi_spec_validator", "openapi-spec-validator>=0.7")
    validator = importlib.import_module("openapi_spec_validator")
    document = spec()
    assert document["openapi"].startswith("3.1")
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.OpenAPIV31SpecValidator(document).iter_errors()
    ]
    assert errors == []
    validator.validate(document)  # raises on an invalid document, whatever the version


def test_every_operation_is_generator_friendly() -> None:
    """Client generators name functions after operationId and group them by tag."""
    document = spec()
    ops = [op for path in document["paths"].values() for op in path.values()]
    assert ops
    for op in ops:
        assert op.get("operationId"), op.get("summary")
        assert op.get("tags"), op["operationId"]
        assert op.get("summary"), op["operationId"]
    secured = [op for op in ops if op.get("security")]
    assert secured and all(op["security"] == [{"HTTPBearer": []}] for op in secured)
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
