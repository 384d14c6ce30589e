"""The Pitstop console: pages over the control-plane API (never the database), for the on-call who lands here.

Run it with ``pitstop console``; the API URL (and optionally a token) arrive as environment variables. This
script signs the visitor in (``signin``), then hands over to the page they chose (``views/``; not ``pages/``,
which Streamlit would also pick up as pages of its own).
"""

from __future__ import annotations

import streamlit as st

from controlplane.console import reads
from controlplane.console.client import ApiUnavailable, ConsoleSettings, TokenRefused
from controlplane.console.frame import CONSOLE_KEY, Console
from controlplane.console.signin import (
    Identity,
    SignInRefused,
    WhoAmI,
    identity_for,
    proxied,
    proxy_user,
    read_only,
    whoami,
)

IDENTITY_KEY = "pitstop_identity"
SIGNED_OUT_KEY = "pitstop_signed_out"
SERVICE_KEY = "pitstop_service_identity"
# A proxy-named person acting through the service token: whoami's answer for them, asked once per session (it
# only picks the buttons: the control plane checks the person's role on every request anyway).
PERSON_KEY = "pitstop_proxy_person"
PAGES = (("views/fleet.py", "Fleet", ":material/traffic:"), ("views/nodes.py", "Nodes & GPUs", ":material/memory:"),
         ("views/replicas.py", "Replicas", ":material/view_list:"),
         ("views/actions.py", "Actions & incidents", ":material/build:"),
         ("views/alerts.py", "Alerts", ":material/notifications:"),
         ("views/policies.py", "Policies", ":material/policy:"))


def _check(settings: ConsoleSettings, token: str | None, via: str) -> Identity:
    with settings.client(token or "") as client:
        who = whoami(client)
    return identity_for(who.name, who.role, who.anonymous, token, via,  # type: ignore[arg-type]
                        delegates=who.on_behalf_of)


def _person(settings: ConsoleSettings, service: Identity, user: str) -> WhoAmI:
    """Whoami for ``user`` through the service token: their name and the role they act with (asked once)."""
    known: WhoAmI | None = st.session_state.get(PERSON_KEY)
    if known is None or known.name != user:
        with settings.client(service.token or "", on_behalf_of=user) as client:
            known = st.session_state[PERSON_KEY] = whoami(client)
    return known


def _forget_session() -> None:
    for key in (IDENTITY_KEY, CONSOLE_KEY, reads.LAST_GOOD_KEY, "pitstop_pending", "pitstop_done", PERSON_KEY):
        st.session_state.pop(key, None)


def _sign_in_form(settings: ConsoleSettings) -> None:
    with st.form("sign-in", clear_on_submit=True):
        st.markdown("**Sign in** with your Pitstop API token (`pitstop server token create`). What you do here "
                    "is recorded under that token's name.")
        token = st.text_input("API token", type="password", key="sign_in_token")
        submitted = st.form_submit_button("Sign in")
    if submitted and token.strip():
        try:
            st.session_state[IDENTITY_KEY] = _check(settings, token.strip(), "token")
        except TokenRefused:
            st.error("The control plane did not accept that token.")
        except (SignInRefused, ApiUnavailable) as exc:
            st.error(str(exc))
        else:
            st.session_state.pop(SIGNED_OUT_KEY, None)
            st.session_state.pop(reads.LAST_GOOD_KEY, None)
            st.rerun()


def _identity(settings: ConsoleSettings) -> Identity | None:
    """Who this is: signed in, the console's own token, a proxy-named person, or a read-only visitor."""
    known: Identity | None = st.session_state.get(IDENTITY_KEY)
    if known is not None:
        return known
    if settings.token and not st.session_state.get(SIGNED_OUT_KEY):
        st.session_state[IDENTITY_KEY] = _check(settings, settings.token, "console")
        return st.session_state[IDENTITY_KEY]
    user = proxy_user(st.context.headers, settings.user_header)
    if user is not None and settings.service_token:
        service: Identity | None = st.session_state.get(SERVICE_KEY)
        if service is None:
            service = st.session_state[SERVICE_KEY] = _check(settings, settings.service_token, "console")
        # A service token that may act on behalf of people carries the person's name on every read and write.
        return proxied(user, service, _person(settings, service, user) if service.delegates else None)
    return read_only(settings)


def _sidebar(identity: Identity) -> None:
    with st.sidebar:
        signed_in = identity.via in ("token", "console") or identity.on_behalf_of is not None
        st.caption("Signed in as" if signed_in else "Looking as")
        st.markdown(f"**{identity.describe()}**")
        if not identity.can_act:
            st.caption("Read only: no action buttons.")
        if identity.via in ("token", "console") and st.button("Sign out", key="sign-out"):
            _forget_session()
            st.session_state[SIGNED_OUT_KEY] = True
            st.rerun()


def main() -> None:
    st.set_page_config(page_title="Pitstop", page_icon=":material/traffic:", layout="wide")
    settings = ConsoleSettings.from_env()
    st.title("Pitstop")
    st.caption(f"Control plane: {settings.api_url}")
    try:
        identity = _identity(settings)
    except TokenRefused as exc:
        st.error(str(exc))
        identity = None
    except SignInRefused as exc:
        st.error(str(exc))
        identity = None
    except ApiUnavailable as exc:
        st.error(f"Control plane unavailable: {exc}")
        return
    if identity is None:
        st.navigation([st.Page(lambda: _sign_in_form(settings), title="Sign in", url_path="sign-in")]).run()
        return
    if identity.via == "proxy" and not identity.can_act:
        _sign_in_form_in_sidebar(settings)
    st.session_state[CONSOLE_KEY] = Console(settings=settings, identity=identity)
    _sidebar(identity)
    st.navigation([st.Page(path, title=title, icon=icon) for path, title, icon in PAGES]).run()


def _sign_in_form_in_sidebar(settings: ConsoleSettings) -> None:
    with st.sidebar.expander("Sign in to act"):
        _sign_in_form(settings)


main()
