"""The errors a request meets, as the server answers them: `ApiError` (a status and OpenAI's error
object), and the 400s for a field's value, a library setting and a body of the wrong shape.
Other protocols put the same errors in their own envelopes (serve/messages.py)."""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import ValidationError

from specrun.serve.bodies import EXPECTED
from specrun.settings import SettingError

SPECULATIVE = ("n_max", "n_min", "p_min")  # the settings of llama-server's `speculative` object


class ApiError(Exception):
    """An error answered with an HTTP status and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def invalid_value(param: str, why: str) -> ApiError:
    """OpenAI's 400 for a request field's value: "Invalid value for 'param': why"."""
    return ApiError(400, f"Invalid value for '{param}': {why}", param, "invalid_value")


def setting_error(error: SettingError, param: str | None = None) -> ApiError:
    """A library setting's error as OpenAI's 400. `param` is the request field; by default
    the library's name, under `speculative.` for llama-server's speculative settings."""
    param = param or (f"speculative.{error.param}" if error.param in SPECULATIVE else error.param)
    return invalid_value(param, f"{error.phrase('it')}.")


def body_error(error: ValidationError) -> ApiError:
    """The first problem pydantic found in a request body, as OpenAI's 400."""
    problem = error.errors(include_url=False)[0]
    kind, location, value = problem["type"], problem["loc"], problem.get("input")
    param = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location).lstrip(".")
    if kind == "json_invalid":
        return ApiError(
            400,
            f"We could not parse the JSON body of your request ({problem['ctx']['error']}): send a JSON object.",
            code="invalid_json",
        )
    if not location:
        return ApiError(400, f"The request body has to be a JSON object, but is {_json_type(value)}.", code="invalid_json")
    if kind == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    expected = problem["ctx"]["expected"] if kind == "invalid_type" else EXPECTED.get(kind)
    if expected:
        return ApiError(
            400, f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead.", param, "invalid_type"
        )
    message = problem["msg"]
    return invalid_value(param, f"{message[0].lower()}{message[1:]}.")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
