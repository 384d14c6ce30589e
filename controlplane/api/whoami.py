"""``GET /v1/whoami``: the name and role a token acts as, so a client (the console) can say who is signed in.

Any token the control plane accepts may ask, whatever its role: the answer is only what the token already is.
The name is the one the API records as ``requested_by`` and in the audit log for that token's writes.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from controlplane.api.context import get_context
from controlplane.security.roles import Role

router = APIRouter(prefix="/v1", tags=["auth"])


class WhoAmI(BaseModel):
    name: str
    role: Role
    # True while the control plane is open (no token exists anywhere): anyone may do anything.
    anonymous: bool = False


@router.get("/whoami", response_model=WhoAmI, summary="The name and role of the calling token",
            responses={401: {"description": "no token"}, 403: {"description": "token not accepted"}})
def whoami(request: Request) -> WhoAmI:
    principal = get_context(request).auth.identify(request.headers.get("authorization"))
    return WhoAmI(name=principal.name, role=principal.role, anonymous=principal.anonymous)
