"""``GET /v1/whoami``: the name and role a token acts as, so a client (the console) can say who is signed in.

Any token the control plane accepts may ask, whatever its role: the answer is only what the token already is.
The name is the one the API records as ``requested_by`` and in the audit log for that token's writes. With
``X-Pitstop-On-Behalf-Of`` the answer is the person's: their name, the role they act with through this token,
and the token's name as ``via``; a token that may not act for people is refused (403), as on every endpoint.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from controlplane.api.context import get_context
from controlplane.security.roles import ON_BEHALF_OF_HEADER, Role

router = APIRouter(prefix="/v1", tags=["auth"])


class WhoAmI(BaseModel):
    name: str
    role: Role
    # True while the control plane is open (no token exists anywhere): anyone may do anything.
    anonymous: bool = False
    # The token may act on behalf of people (a static token configured with on_behalf_of: true).
    on_behalf_of: bool = False
    # Acting for the person in ``name``: the name of the token it goes through (recorded beside the person's).
    via: str | None = None


@router.get("/whoami", response_model=WhoAmI, summary="The name and role of the calling token (or of the person "
            "it acts for)",
            responses={400: {"description": f"{ON_BEHALF_OF_HEADER} is not one person's name"},
                       401: {"description": "no token"},
                       403: {"description": "token not accepted, or one that may not act on behalf of anyone"}})
def whoami(request: Request) -> WhoAmI:
    principal = get_context(request).auth.identify(request.headers.get("authorization"),
                                                   request.headers.getlist(ON_BEHALF_OF_HEADER))
    return WhoAmI(name=principal.name, role=principal.role, anonymous=principal.anonymous,
                  on_behalf_of=principal.on_behalf_of, via=principal.via)
