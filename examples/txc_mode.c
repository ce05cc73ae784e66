/*
 * txc_mode.c - txc-mode: the operator's runtime switch of the fallback to
 * local mode on running services (POST /admin/mode, svc_admin.h).
 *
 *   txc-mode local|global|auto [--url URL]... [--operator NAME]
 *   txc-mode status [--url URL]...
 *
 * Without --url: ORDER_URL and STOCK_URL from the environment (what
 * examples/services prints).  Credential: TXC_ADMIN_TOKEN_FILE's token as
 * a bearer token when that is set, else a signature with the services'
 * key (TXC_SERVICE_KEY_FILE), with at_ms so that the call cannot be
 * replayed later.  Prints one line per service; exit 0 when every service
 * answered 200, 1 when one did not, 2 on a usage error.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#include "svc_auth.h"
#include "svc_http.h"
#include "txc_buf.h"
#include "txc_isotime.h"
#include "txc_secret.h"

static void usage(FILE *f) {
  fprintf(f, "usage: txc-mode local|global|auto|status [--url URL]... [--operator NAME]\n"
             "Force the transaction mode of running order-service / stock-service instances\n"
             "(local: local transactions with compensation; global: through the coordinator;\n"
             "auto: back to degrade detection), or show it.  Default URLs: ORDER_URL, STOCK_URL.\n"
             "Credential: TXC_ADMIN_TOKEN_FILE (bearer token), else TXC_SERVICE_KEY_FILE (signature).\n"
             "exit status: 0 every service answered, 1 one did not, 2 usage\n");
}

/* One call; prints its line.  true on a 200. */
static bool call(const char *url, const char *mode, const char *op, const char *token, const svc_auth_t *auth) {
  bool status_only = strcmp(mode, "status") == 0;
  char *body = NULL;
  if (!status_only) {
    json_t *j = json_pack("{s:s,s:I}", "mode", mode, "at_ms", (json_int_t)txc_unix_ms());
    if (op) json_object_set_new(j, "operator", json_string(op));
    body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
  }
  char full[1024], h[512];
  snprintf(full, sizeof(full), "%s/admin/mode", url);
  struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
  if (token) {
    snprintf(h, sizeof(h), "Authorization: Bearer %s", token);
  } else {
    char sig[SVC_AUTH_HEX_MAX];
    svc_http_sign(auth, status_only ? "GET" : "POST", "/admin/mode", NULL, NULL, body ? body : "",
                  body ? strlen(body) : 0, sig);
    snprintf(h, sizeof(h), "%s: %s", SVC_AUTH_HEADER, sig);
  }
  hdrs = curl_slist_append(hdrs, h);
  CURL *e = curl_easy_init();
  txc_buf_t b = {.max = 65536};
  long code = 0;
  CURLcode cc = CURLE_FAILED_INIT;
  if (e) {
    curl_easy_setopt(e, CURLOPT_URL, full);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    if (body) curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, txc_buf_curl_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 10000L);
    cc = curl_easy_perform(e);
    if (cc == CURLE_OK) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
  }
  json_t *ans = b.p ? json_loads(b.p, 0, NULL) : NULL;
  if (cc != CURLE_OK)
    printf("%s: no answer: %s\n", url, curl_easy_strerror(cc));
  else if (code == 200)
    printf("%s: mode %s (forced %s, detected %s)\n", url, json_string_value(json_object_get(ans, "mode")),
           json_string_value(json_object_get(ans, "forced")), json_string_value(json_object_get(ans, "detected")));
  else
    printf("%s: HTTP %ld %s%s%s\n", url, code, json_string_value(json_object_get(ans, "error")) ?: "",
           json_object_get(ans, "detail") ? ": " : "", json_string_value(json_object_get(ans, "detail")) ?: "");
  json_decref(ans);
  free(b.p);
  free(body);
  curl_slist_free_all(hdrs);
  if (e) curl_easy_cleanup(e);
  return cc == CURLE_OK && code == 200;
}

int main(int argc, char **argv) {
  static const struct option lo[] = {{"url", required_argument, NULL, 'u'},
                                     {"operator", required_argument, NULL, 'o'},
                                     {"help", no_argument, NULL, 'h'},
                                     {NULL, 0, NULL, 0}};
  const char *urls[16];
  int nurls = 0, c;
  const char *op = NULL;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'u':
      if (nurls == 16) {
        fprintf(stderr, "txc-mode: at most 16 --url\n");
        return 2;
      }
      urls[nurls++] = optarg;
      break;
    case 'o': op = optarg; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind != argc - 1) {
    usage(stderr);
    return 2;
  }
  const char *mode = argv[optind];
  if (strcmp(mode, "local") != 0 && strcmp(mode, "global") != 0 && strcmp(mode, "auto") != 0 &&
      strcmp(mode, "status") != 0) {
    fprintf(stderr, "txc-mode: unknown mode \"%s\": expected local, global, auto or status\n", mode);
    return 2;
  }
  if (!nurls) {
    const char *o = getenv("ORDER_URL"), *s = getenv("STOCK_URL");
    if (o && *o) urls[nurls++] = o;
    if (s && *s) urls[nurls++] = s;
  }
  if (!nurls) {
    fprintf(stderr, "txc-mode: no --url and neither ORDER_URL nor STOCK_URL is set\n");
    return 2;
  }
  char err[512], token[256];
  const char *tf = getenv("TXC_ADMIN_TOKEN_FILE");
  svc_auth_t *auth = NULL;
  bool have_token = false;
  if (tf && *tf) {
    if (txc_secret_read(tf, token, sizeof(token), err, sizeof(err)) != 0) {
      fprintf(stderr, "txc-mode: could not read TXC_ADMIN_TOKEN_FILE: %s\n", err);
      return 1;
    }
    have_token = true;
  } else if (!(auth = svc_auth_from_env(err, sizeof(err)))) {
    fprintf(stderr, "txc-mode: %s\n",
            err[0] ? err : "no credential: set TXC_ADMIN_TOKEN_FILE or TXC_SERVICE_KEY_FILE");
    return 1;
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  bool all = true;
  for (int i = 0; i < nurls; i++) all = call(urls[i], mode, op, have_token ? token : NULL, auth) && all;
  curl_global_cleanup();
  svc_auth_free(auth);
  return all ? 0 : 1;
}
