/* Where the Kubernetes API server is and how to authenticate to it: a
 * kubeconfig file (current or named context; token, token file, client
 * certificate and key as files or inline data, CA as file or inline data,
 * insecure-skip-tls-verify) or the in-cluster service account (environment
 * KUBERNETES_SERVICE_HOST/PORT, token, CA bundle and namespace files).
 *
 * A token read from a file (in-cluster, or a kubeconfig `tokenFile`) is
 * re-read when the file changes (kubelet rotates projected service-account
 * tokens by swapping a symlink) and at least every minute, so a long-running
 * daemon never keeps sending an expired token. kube_config_token() is
 * thread-safe; everything else is read-only after loading. */
#ifndef GKM_KUBE_CONFIG_H
#define GKM_KUBE_CONFIG_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

/* Service-account locations of a pod; tests point them elsewhere. */
#define KUBE_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

struct kube_blob {
	unsigned char *data; /* NULL when absent */
	size_t len;
};

struct kube_config {
	char *server;          /* "https://10.0.0.1:443" (no trailing slash) */
	char *namespace;       /* default namespace ("default" when none is set) */
	char *context;         /* context name used; NULL in-cluster */
	char *tls_server_name; /* SNI / verification name override, or NULL */
	bool insecure;         /* insecure-skip-tls-verify */
	/* Trust: a CA file path, or PEM data (exactly one or neither). */
	char *ca_file;
	struct kube_blob ca_data;
	/* Client certificate and key: file paths or PEM data. */
	char *cert_file, *key_file;
	struct kube_blob cert_data, key_data;
	/* Basic auth (rare; kept for completeness of the kubeconfig format). */
	char *username, *password;

	/* Bearer token: a fixed string, or a file re-read on rotation. */
	pthread_mutex_t token_lock;
	char *token;      /* current token (guarded by token_lock when token_file is set) */
	char *token_file; /* NULL for a fixed token */
	struct timespec token_mtime;
	unsigned long long token_ino;
	long long token_size;
	unsigned long long token_checked_ms; /* monotonic ms of the last stat() */
	unsigned long long token_reread_ms;  /* monotonic ms of the last read */
};

/* Load a kubeconfig. path NULL: $KUBECONFIG (the first existing file of the
 * colon-separated list), else ~/.kube/config. context NULL: current-context.
 * Relative file paths are resolved against the kubeconfig's directory.
 * On failure *out is untouched and err says what is wrong and where
 * ("kubeconfig /x: context \"prod\" not found"). Caller frees with
 * kube_config_free(). 0 or -errno. */
__attribute__((warn_unused_result)) int kube_config_load_file(const char *path, const char *context,
                                                              struct kube_config **out, char *err,
                                                              size_t errlen);

/* In-cluster configuration. sa_dir NULL means KUBE_SA_DIR. Needs
 * KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT and a readable token.
 * -ENOENT when not running in a cluster. */
__attribute__((warn_unused_result)) int
kube_config_load_incluster(const char *sa_dir, struct kube_config **out, char *err, size_t errlen);

/* What a daemon does: an explicit kubeconfig path if given, else in-cluster
 * when KUBERNETES_SERVICE_HOST is set, else $KUBECONFIG / ~/.kube/config. */
__attribute__((warn_unused_result)) int kube_config_load(const char *path, const char *context,
                                                         struct kube_config **out, char *err,
                                                         size_t errlen);

/* Copy the current bearer token into buf ("" when none), re-reading the
 * token file first if it changed. Thread-safe. 0, -ENOSPC if buf is too
 * small, or -errno when the token file cannot be read and no token was ever
 * read (after a good read, a transient read error is logged and the last
 * good token is used: it must not log us out). */
__attribute__((warn_unused_result)) int kube_config_token(struct kube_config *c, char *buf,
                                                          size_t len);

void kube_config_free(struct kube_config *c);

/* Parse a YAML document (one, bounded to 1 MiB and 64 levels) into cJSON.
 * Scalars become strings, except plain true/false/null and plain integers.
 * Used for kubeconfig files and apply payloads given as YAML. Caller frees
 * *out with cJSON_Delete(). 0 or -EINVAL with err set. */
struct cJSON;
__attribute__((warn_unused_result)) int kube_config_yaml_to_json(const char *text, size_t len,
                                                                 struct cJSON **out, char *err,
                                                                 size_t errlen);

#endif
