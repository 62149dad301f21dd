"""Browser pages of the gpulease service: a user's usage, the admins' report, and errors.

Pages log in through the hub's OAuth (an anonymous browser is sent to the
hub's login); every text shown is escaped by the templates' autoescape.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from urllib.parse import urlencode

from jupyterhub.services.auth import HubOAuthCallbackHandler
from jupyterhub.utils import url_path_join
from tornado import web

from gpulease.core.clock import utcnow
from gpulease.core.refusal import Refusal
from gpulease.core.units import seconds_text
from gpulease.hub.service import billing_views as bv
from gpulease.hub.service import hub_static
from gpulease.hub.service import right_sizing_views as rs
from gpulease.hub.service.api.billing import BillingHandler, balance_of
from gpulease.hub.web.error_text import ErrorText, error_text
from gpulease.hub.web.site_nav import SiteNav
from gpulease.sign_in_failure import sign_in_failure
from gpulease.site_urls import SiteURLs
from gpulease.store import billing_reports

CHART_DAYS = 30


class PageHandler(BillingHandler):
    """HTML out; errors as a readable page, not JSON."""

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        # frame-ancestors 'none', not 'self': where researchers' servers share the
        # hub's origin (GPULeaseHub.allow_shared_origin), a page one of them serves
        # could frame an admin's forms and trick clicks on them.
        # 'self' for styles and fonts: JupyterHub's own stylesheet, which this service
        # serves (hub_static.py), so that its pages look like the hub's.
        self.set_header("Content-Security-Policy",
                        "default-src 'none'; style-src 'self' 'unsafe-inline'; "
                        "font-src 'self'; img-src data:; "
                        "form-action 'self'; frame-ancestors 'none'")
        self.set_header("X-Frame-Options", "DENY")

    def get_template_namespace(self) -> dict:
        ns = super().get_template_namespace()
        prefix = self.settings.get("gpulease_prefix", "/services/gpulease/")
        name = self._user_name()
        urls = self.settings.get("gpulease_urls") or SiteURLs("/")
        nav = SiteNav(urls)
        ns.update(prefix=prefix, user_name=name, urls=urls, hub_home=urls.hub("home"),
                  nav=nav, nav_items=self._nav_items(nav),
                  hub_stylesheet=url_path_join(prefix, hub_static.STYLESHEET_LINK),
                  seconds_text=seconds_text)
        return ns

    def _nav_items(self, nav: SiteNav) -> list:
        """The bar's items for the caller (hub/web/site_nav.py), none for no one signed in."""
        model = self.current_user
        if not isinstance(model, dict) or not model.get("name"):
            return []
        return nav.items(bool(model.get("admin")), model.get("scopes") or ())

    def _user_name(self) -> str | None:
        model = self.current_user
        return model.get("name") if isinstance(model, dict) else None

    def write_error(self, status_code: int, **kwargs) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, Refusal):
            status_code = exc.status
            self.set_status(status_code)
            for name, value in exc.headers.items():  # Retry-After, as the JSON answer has
                self.set_header(name, value)
            # the one field it names, on a page that has no form to show it beside
            one = exc.errors[0] if len(exc.errors) == 1 else None
            message = str(one) if one and one.message == exc.message else exc.message
        else:
            message = self.error_message(status_code, exc)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self._caller_or_no_one()
        self.finish(self.render_string("error.html", status=status_code, message=message,
                                       text=self.page_text(status_code)))

    def _caller_or_no_one(self) -> None:
        """Who the page's header names: asked of the hub now if nobody asked before the
        error, and no one where the hub cannot say (it is down or restarting). An error
        page renders all the same, never an empty body with its status."""
        if hasattr(self, "_current_user"):
            return
        try:
            self._current_user = self.get_current_user()
        except Exception:  # noqa: BLE001 - HubAuth logged why; the page names no one
            self._current_user = self._hub_auth_user_cache = None

    def page_text(self, status_code: int) -> ErrorText:
        """The page's title and advice."""
        return error_text(status_code)

    def error_message(self, status_code: int, exc: BaseException | None) -> str:
        """The page's detail for an error that is not a Refusal (those say their own)."""
        if status_code >= 500:
            return "The gpulease service failed to answer this page; its log has the details."
        if isinstance(exc, web.HTTPError) and exc.log_message:  # "Missing argument since"
            return exc.log_message % exc.args if exc.args else exc.log_message
        return ""  # the status's plain title says it


class PageNotFound(PageHandler):
    """Any address of the service no route serves (the JSON API has its own 404)."""

    def prepare(self) -> None:
        raise web.HTTPError(404)

    def error_message(self, status_code: int, exc: BaseException | None) -> str:
        return "gpulease has no page at this address."


class OAuthCallbackPage(HubOAuthCallbackHandler, PageHandler):
    """The end of a browser's sign-in to the service's pages (JupyterHub's handler), whose
    failures (a stale or replayed state, a code the hub refuses) are a page too."""

    def page_text(self, status_code: int) -> ErrorText:
        failure = sign_in_failure(status_code)
        return replace(error_text(status_code), title=failure.headline, advice=failure.advice)

    def error_message(self, status_code: int, exc: BaseException | None) -> str:
        return sign_in_failure(status_code).cause  # never the exception's text


class UsagePage(PageHandler):
    @web.authenticated
    async def get(self):
        me = self.caller()
        name = me["name"]
        today = utcnow().date()
        first = today - dt.timedelta(days=CHART_DAYS - 1)
        chart_since = dt.datetime.combine(first, dt.time())
        chart_until = dt.datetime.combine(today + dt.timedelta(days=1), dt.time())
        since_arg = self.get_argument("since", None) or first.isoformat()
        until_arg = self.get_argument("until", None)
        since, until = bv.usage_period(since_arg, until_arg, utcnow())  # PeriodError: a 400
        model = await self.hub_user(name)
        balance = await self.run(balance_of, self.ctx, name, model.get("groups") or [])
        report = await self.run(billing_reports.usage, self.ctx.engine, user=name,
                                since=since, until=until)
        points = await self.run(billing_reports.spend_per_day, self.ctx.engine, user=name,
                                account=None, since=chart_since, until=chart_until)
        entries = await self.run(self.ledger.entries, account=f"user:{name}",
                                 since=chart_since)
        view = bv.usage_view(report.sessions, report.totals)
        series = bv.daily_series(points, first, CHART_DAYS)
        # the hub's model of the user: their groups decide what may be suggested
        advice = rs.advice_view(await self.advice(name, me, model.get("groups") or []))
        self.render(
            "usage.html",
            name=name,
            balance=balance,
            sessions=view["sessions"],
            advice=advice,
            gpu_cells=bv.gpu_cells,  # each session's GPU: "no reading" where none came
            totals=view["totals"],
            since=since_arg,
            until=until_arg or "",
            credits=bv.credit_rows(entries),
            chart_svg=bv.spend_chart_svg(series),
            chart_total=bv.money(sum(ucr for _, ucr in series)),
            chart_first=first.isoformat(),
            chart_last=today.isoformat(),
        )


class ReportPage(PageHandler):
    @web.authenticated
    async def get(self):
        self.require_auditor()
        start = bv.month_start(utcnow())
        since_arg = self.get_argument("since", None) or start.date().isoformat()
        until_arg = self.get_argument("until", None) or bv.next_month(start).date().isoformat()
        by = self.get_argument("by", "user")
        if by not in bv.REPORT_GROUPS:
            raise Refusal(f"by must be one of {', '.join(bv.REPORT_GROUPS)}, got {by!r}")
        # any span: admins and auditors report on years (aggregated, not listed)
        since, until = bv.parse_period(since_arg, until_arg)
        rows = bv.report_view(await self.run(billing_reports.report, self.ctx.engine,
                                             since=since, until=until, group_by=by), by)
        sizing_now = utcnow()
        if self.get_argument("format", "html") == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            name = f"gpulease-report-by-{by}-{since_arg}-{until_arg}"
            self.set_header("Content-Disposition",
                            f'attachment; filename="{bv.safe_filename(name)}.csv"')
            self.finish(billing_reports.to_csv(rows, bv.REPORT_COLUMNS))
            return
        query = {"since": since_arg, "until": until_arg, "by": by}
        # the last 30 days whatever the period: as GET api/right-sizing
        profiles = await self.run(self.ctx.profiles.list, True)
        sizing = await self.run(rs.report_of, self.ctx.engine, profiles, sizing_now)
        self.render(
            "report.html",
            rows=rows,
            totals=bv.report_totals(rows),
            since=since_arg,
            until=until_arg,
            by=by,
            groups=bv.REPORT_GROUPS,
            csv_url="?" + urlencode({**query, "format": "csv"}),
            sizing=sizing,
            sizing_days=rs.report_window(sizing_now)["days"],
        )
