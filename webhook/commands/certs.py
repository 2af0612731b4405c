"""`gpu-admission certs`: a CA and a serving certificate for the webhook Service, in files or in a Secret.

`--renew` keeps the CA (so the caBundle in the webhook configurations stays valid) and replaces only the
serving certificate. `--secret` keeps them in a Secret instead, renewing only when due (certs/secret.py,
the chart's certificate Job)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from webhook.certs.authority import DEFAULT_DAYS, DEFAULT_RENEW_BEFORE_DAYS, issue_certificates, write_files
from webhook.certs.record_key import ensure_record_key
from webhook.certs.secret import KubernetesCertificateApi, patch_webhooks, sync_secret
from webhook.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Make a CA and a serving certificate for the webhook Service and print the base64 caBundle. "
        "With --secret the pair lives in a kubernetes.io/tls Secret: a usable CA there is reused and a "
        "serving certificate with more than --renew-before-days left is kept, so running it again changes "
        "nothing until renewal is due. --patch-webhook puts the CA into the webhook configurations."
    )
    parser.add_argument("--service", required=True, help="name of the webhook's Service")
    parser.add_argument("--namespace", required=True, help="namespace of the Service (and of --secret)")
    parser.add_argument(
        "--out", metavar="DIR", help="directory for tls.crt, tls.key, ca.crt, ca.key (with --secret: a copy)"
    )
    parser.add_argument(
        "--days",
        type=int,
        default=DEFAULT_DAYS,
        help=f"serving certificate lifetime (default {DEFAULT_DAYS})",
    )
    parser.add_argument(
        "--renew",
        action="store_true",
        help="keep the CA in DIR (ca.crt, ca.key) and replace only the serving certificate (without --secret)",
    )
    parser.add_argument(
        "--secret", metavar="NAME", help="keep the certificates in this Secret of --namespace (read, then written)"
    )
    parser.add_argument(
        "--renew-before-days",
        type=int,
        metavar="D",
        help=f"with --secret: issue a new serving certificate once D days or fewer remain "
        f"(default {DEFAULT_RENEW_BEFORE_DAYS}, at most half of --days)",
    )
    parser.add_argument(
        "--patch-webhook",
        action="append",
        default=[],
        metavar="NAME",
        help="set caBundle in the Mutating- and ValidatingWebhookConfiguration NAME on the webhooks that call "
        "--service in --namespace (repeatable; a configuration that does not exist yet is skipped)",
    )
    parser.add_argument(
        "--record-key-secret",
        metavar="NAME",
        help="also make sure Secret NAME of --namespace holds a record key (record.key): made when absent, "
        "never changed once there",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")


def run(args: argparse.Namespace, api: Any = None) -> int:
    """`api`: a `certs.secret.CertificateApi` (tests); None builds one from --kubeconfig or the pod's account."""
    if args.record_key_secret and not (args.out or args.secret or args.patch_webhook):
        ensure_record_key(api or _kubernetes_api(args), args.namespace, args.record_key_secret, _report)
        return 0
    renew_before = _check_arguments(args)
    if args.secret:
        api = api or _kubernetes_api(args)
        outcome = sync_secret(
            api,
            args.namespace,
            args.secret,
            args.service,
            days=args.days,
            renew_before_days=renew_before,
            report=_report,
        )
        if args.out:
            write_files(Path(args.out), outcome.material.files())
        bundle = outcome.material.ca_bundle()
    else:
        paths = issue_certificates(Path(args.out), args.service, args.namespace, days=args.days, renew=args.renew)
        bundle = paths.ca_bundle()
    if args.record_key_secret:
        api = api or _kubernetes_api(args)
        ensure_record_key(api, args.namespace, args.record_key_secret, _report)
    if args.patch_webhook:
        api = api or _kubernetes_api(args)
        patch_webhooks(api, args.patch_webhook, args.service, args.namespace, bundle, report=_report)
    print(bundle)
    return 0


def _check_arguments(args: argparse.Namespace) -> int:
    """The renewal margin in days, after checking the options fit together."""
    if args.days < 1:
        raise UserError(f"--days must be at least 1, got {args.days}")
    if not args.out and not args.secret:
        raise UserError("give --out DIR, --secret NAME, or both")
    if args.secret and args.renew:
        raise UserError("--renew is for --out without --secret: with --secret a usable CA is always reused")
    if args.renew_before_days is None:
        return min(DEFAULT_RENEW_BEFORE_DAYS, int(args.days) // 2)
    if not args.secret:
        raise UserError("--renew-before-days applies to --secret only")
    if not 0 <= args.renew_before_days < args.days:
        raise UserError(
            f"--renew-before-days must be from 0 to less than --days ({args.days}), got {args.renew_before_days}"
        )
    return int(args.renew_before_days)


def _kubernetes_api(args: argparse.Namespace) -> Any:
    from webhook.cluster.config import load_api_client


    return KubernetesCertificateApi(load_api_client(args.kubeconfig, args.context))


def _report(message: str) -> None:
    print(f"gpu-admission certs: {message}", file=sys.stderr, flush=True)
