package validate_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"shop/deploy/validate"
)

// repoDir is the repository, from this package's directory.
const repoDir = "../.."

// edit replaces old, which must occur exactly once, with new in file.
type edit struct{ file, old, new string }

// brokenCase is one way to break a copy of the files: its edits, and what
// the rejection must name.
type brokenCase struct {
	name  string
	edits []edit
	want  string
}

// service reads what the deployment files must agree with from cmd/shop.
func service(t *testing.T) validate.Service {
	t.Helper()
	svc, err := validate.ReadService(filepath.Join(repoDir, "cmd/shop"))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// repo returns the repository's absolute path.
func repo(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(repoDir)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// brokenCopy copies files (paths relative to from) into a new directory,
// applies edits there and returns the directory. An edit whose old text is
// not found exactly once fails the test: a case that breaks nothing would
// pass for the wrong reason.
func brokenCopy(t *testing.T, from string, files []string, edits []edit) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range edits {
			if e.file != f {
				continue
			}
			if n := strings.Count(string(b), e.old); n != 1 {
				t.Fatalf("%s: %q occurs %d times; the edit needs exactly one", f, e.old, n)
			}
			b = []byte(strings.Replace(string(b), e.old, e.new, 1))
		}
		path := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range edits {
		if _, err := os.Stat(filepath.Join(dir, e.file)); err != nil {
			t.Fatalf("edit of %s, which is not copied", e.file)
		}
	}
	return dir
}

// k8sFiles are the files of deploy/k8s.
func k8sFiles(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(repoDir, "deploy/k8s"))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	return files
}

// wantRejected fails unless err names want.
func wantRejected(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want an error naming %q", want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error:\n%v\nwant one naming %q", err, want)
	}
	t.Logf("rejected: %v", firstLine(err))
}

func firstLine(err error) string {
	line, _, _ := strings.Cut(err.Error(), "\n")
	return line
}

func TestReadService(t *testing.T) {
	svc := service(t)
	for _, name := range []string{"SHOP_HTTP_ADDR", "SHOP_MYSQL_DSN", "SHOP_REDIS_ADDR", "SHOP_ADMIN_TOKEN", "SHOP_DRAIN", "SHOP_LOCK_MODE"} {
		if !svc.Env[name] {
			t.Errorf("%s not found among the settings cmd/shop reads: %v", name, svc.Env)
		}
	}
	// Only the command's own files: a test's variables are not settings.
	if svc.Env["SHOP_TEST_MYSQL_DSN"] {
		t.Errorf("SHOP_TEST_MYSQL_DSN taken for a setting")
	}
	if svc.Defaults["SHOP_HTTP_ADDR"] == "" || svc.Drain <= 0 || svc.Shutdown <= 0 {
		t.Errorf("listen default %q, drain %s, shutdown %s; want all three read from cmd/shop",
			svc.Defaults["SHOP_HTTP_ADDR"], svc.Drain, svc.Shutdown)
	}
	t.Logf("%d settings; SHOP_HTTP_ADDR default %q, drain %s, shutdown %s", len(svc.Env), svc.Defaults["SHOP_HTTP_ADDR"], svc.Drain, svc.Shutdown)
}

// testSecret is a payment provider's signing secret as shop takes it:
// whsec_ and 32 bytes in standard base64.
var testSecret = "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x5a}, 32))

// testJWTSecret is a buyers' token secret as shop takes it: 32 bytes.
var testJWTSecret = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x6b}, 32))

// fillSecret fills secret.env's empty placeholder of the payment secret in.
var fillSecret = edit{"secret.env", "SHOP_PAYMENT_WEBHOOK_SECRET=\n", "SHOP_PAYMENT_WEBHOOK_SECRET=" + testSecret + "\n"}

// fillJWTSecret fills secret.env's empty placeholder of the buyers' token
// secret in.
var fillJWTSecret = edit{"secret.env", "SHOP_JWT_SECRET=\n", "SHOP_JWT_SECRET=" + testJWTSecret + "\n"}

// emptyJWTSecret is what the validation says of an empty token secret.
const emptyJWTSecret = "SHOP_JWT_SECRET is empty (and no SHOP_JWT_PUBLIC_KEYS): with SHOP_AUTH=jwt, shop serve refuses to start"

// emptySecret is what the validation says of an empty payment secret.
const emptySecret = "SHOP_PAYMENT_WEBHOOK_SECRET is empty: with a pay window (SHOP_PAY_WINDOW 15m0s), shop serve refuses to start"

// checkK8sCopy renders a copy of deploy/k8s with edits and checks it.
func checkK8sCopy(t *testing.T, svc validate.Service, edits ...edit) error {
	t.Helper()
	dir := brokenCopy(t, filepath.Join(repoDir, "deploy/k8s"), k8sFiles(t), edits)
	m, err := validate.Render(dir)
	if err != nil {
		return err
	}
	return validate.CheckK8s(m, svc)
}

// TestK8s renders deploy/k8s and checks it: every object decodes strictly
// into its API type and the manifests run the service as it expects, once
// the payment provider's secret and the buyers' token secret are filled
// in. As shipped, with those secrets' placeholders empty, they are refused
// for them, and for nothing else; without a pay window no payment secret
// is needed.
func TestK8s(t *testing.T) {
	svc := service(t)
	m, err := validate.Render(filepath.Join(repoDir, "deploy/k8s"))
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{
		"Namespace": len(m.Namespaces), "ConfigMap": len(m.ConfigMaps), "Secret": len(m.Secrets),
		"Service": len(m.Services), "Deployment": len(m.Deployments), "PodDisruptionBudget": len(m.PDBs), "Job": len(m.Jobs),
		"NetworkPolicy": len(m.Policies),
	}
	for kind, n := range counts {
		if n != 1 {
			t.Errorf("%d %s objects; want 1", n, kind)
		}
	}
	err = validate.CheckK8s(m, svc)
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 2 || !strings.Contains(err.Error(), emptySecret) || !strings.Contains(err.Error(), emptyJWTSecret) {
		t.Fatalf("deploy/k8s as shipped:\n%v\nwant its empty payment and token secrets refused, and nothing else", err)
	}
	t.Logf("as shipped, refused: %v", err)
	if err := checkK8sCopy(t, svc, fillSecret, fillJWTSecret); err != nil {
		t.Fatalf("deploy/k8s with the secrets filled in:\n%v", err)
	}
	if err := checkK8sCopy(t, svc, fillJWTSecret, edit{"config.env", "SHOP_PAYMENTS=webhook\n", "SHOP_PAYMENTS=webhook\nSHOP_PAY_WINDOW=0\n"}); err != nil {
		t.Fatalf("deploy/k8s without a pay window, with no payment secret:\n%v", err)
	}
}

// TestK8sRejectsBrokenCopies breaks a copy of deploy/k8s in one way per
// case and expects the validation to reject it, naming the problem: the
// strict decoding, and each check.
func TestK8sRejectsBrokenCopies(t *testing.T) {
	const (
		dep      = "deployment.yaml"
		conf     = "config.env"
		job      = "job-setup.yaml"
		seedArgs = `args: ["seed", "--if-empty", "--products", "5000", "--stock", "1"]`
		netpol   = "networkpolicy.yaml"
	)
	svc := service(t)
	cases := []brokenCase{
		{"kustomization typo", []edit{{"kustomization.yaml", "\nimages:\n", "\nimage:\n"}}, `invalid Kustomization: json: unknown field "image"`},
		{"unknown field", []edit{{dep, "  replicas: 3\n", "  replicas: 3\n  replica: 3\n"}}, `unknown field "replica"`},
		{"pod field in a container", []edit{{dep, "          imagePullPolicy: IfNotPresent\n", "          imagePullPolicy: IfNotPresent\n          hostNetwork: true\n"}}, `unknown field "hostNetwork"`},
		{"wrong type", []edit{{dep, "  replicas: 3\n", "  replicas: three\n"}}, "replicas"},
		{"API version no longer served", []edit{{"pdb.yaml", "apiVersion: policy/v1\n", "apiVersion: policy/v1beta1\n"}}, "unknown kind: policy/v1beta1 PodDisruptionBudget"},
		{"readiness path", []edit{{dep, "path: /readyz", "path: /ready"}}, `readinessProbe: path "/ready"`},
		{"liveness port", []edit{{dep, "path: /healthz\n              port: http", "path: /healthz\n              port: 9090"}}, "livenessProbe: port 9090"},
		{"service targetPort", []edit{{"service.yaml", "targetPort: http", "targetPort: 8081"}}, "targetPort 8081 is not 8080"},
		{"service selects nothing", []edit{{"service.yaml", "  selector:\n    app.kubernetes.io/name: shop\n    app.kubernetes.io/component: server",
			"  selector:\n    app.kubernetes.io/name: shop\n    app.kubernetes.io/component: api"}}, "no Service selects the replicas' pods"},
		{"service selects the job", []edit{{"service.yaml", "  selector:\n    app.kubernetes.io/name: shop\n    app.kubernetes.io/component: server",
			"  selector:\n    app.kubernetes.io/name: shop"}}, "selects the pods of Job shop-setup"},
		{"budget selects nothing", []edit{{"pdb.yaml", "      app.kubernetes.io/component: server", "      app.kubernetes.io/component: api"}}, "no PodDisruptionBudget selects"},
		{"budget blocks drains", []edit{{"pdb.yaml", "maxUnavailable: 1", "minAvailable: 3"}}, "lets no replica go"},
		{"grace too short", []edit{{dep, "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 30"}}, "terminationGracePeriodSeconds 30s is less than preStop sleep 5s + SHOP_DRAIN 5s + shutdown 30s"},
		{"drain raised, grace not", []edit{{conf, "SHOP_DRAIN=5s", "SHOP_DRAIN=20s"}}, "SHOP_DRAIN 20s"},
		{"no preStop sleep", []edit{{dep, "sleep:\n                seconds: 5", "exec:\n                command: [\"true\"]"}}, "want a preStop sleep"},
		{"setting shop does not read", []edit{{conf, "SHOP_LOCK_MODE=redis\n", "SHOP_LOCK_MODE=redis\nSHOP_LOCKMODE=redlock\n"}}, "SHOP_LOCKMODE: not a setting shop reads"},
		{"password in the ConfigMap", []edit{
			{conf, "SHOP_LOCK_MODE=redis\n", "SHOP_LOCK_MODE=redis\nSHOP_MYSQL_DSN=shop:pw@tcp(mysql:3306)/shop\n"},
			{"secret.env", "SHOP_MYSQL_DSN=shop:CHANGE-ME@tcp(mysql:3306)/shop?parseTime=true\n", ""},
		}, "SHOP_MYSQL_DSN comes from ConfigMap"},
		{"no Redis address", []edit{{conf, "SHOP_REDIS_ADDR=redis:6379\n", ""}}, "SHOP_REDIS_ADDR is not set"},
		{"in-process lock on three replicas", []edit{{conf, "SHOP_LOCK_MODE=redis", "SHOP_LOCK_MODE=local"}}, "SHOP_LOCK_MODE=local on several replicas oversells"},
		{"listens elsewhere", []edit{{conf, "SHOP_HTTP_ADDR=:8080", "SHOP_HTTP_ADDR=:9000"}}, "declares no port 9000"},
		{"ConfigMap renamed", []edit{{"kustomization.yaml", "  - name: shop-config\n", "  - name: shop-settings\n"}}, "envFrom: no ConfigMap shop-config"},
		{"rollout lowers capacity", []edit{{dep, "maxUnavailable: 0", "maxUnavailable: 1"}}, "rollingUpdate.maxUnavailable 1"},
		{"privilege escalation", []edit{{dep, "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true"}}, "container shop: want allowPrivilegeEscalation: false"},
		{"root", []edit{{dep, "runAsUser: 10001", "runAsUser: 0"}}, "want runAsUser 10001"},
		{"no CPU limit", []edit{{dep, "              cpu: \"2\"\n", ""}}, "container shop: no cpu limit"},
		{"GOMEMLIMIT above the limit", []edit{{dep, "value: 460MiB", "value: 600MiB"}}, "GOMEMLIMIT 600MiB is not below the memory limit 512Mi"},
		{"job does not seed", []edit{{job, seedArgs, `args: ["verify"]`}}, "no Job runs shop migrate and then shop seed"},
		{"job seeds before migrating", []edit{
			{job, `args: ["migrate"]`, `args: ["swap"]`},
			{job, seedArgs, `args: ["migrate"]`},
			{job, `args: ["swap"]`, seedArgs},
		}, "no Job runs shop migrate and then shop seed"},
		{"job resets the catalog", []edit{{job, `"--if-empty", `, ""}}, "Job shop-setup: runs shop seed without --if-empty"},
		{"job turns --if-empty off", []edit{{job, `"--if-empty", `, `"--if-empty", "--if-empty=false", `}}, "Job shop-setup: runs shop seed without --if-empty"},
		{"secret named without its hash", []edit{{"kustomization.yaml", "    envs:\n      - secret.env\n", "    envs:\n      - secret.env\n    options:\n      disableNameSuffixHash: true\n"}},
			"Secret shop-secrets: the name does not end in the hash of its content, as a kustomize generator names it (shop-secrets-"},
		{"settings named without their hash", []edit{{"kustomization.yaml", "\nconfigMapGenerator:\n", "\ngeneratorOptions:\n  disableNameSuffixHash: true\nconfigMapGenerator:\n"}},
			"ConfigMap shop-config: the name does not end in the hash of its content"},
		{"deployment reads another secret", []edit{{dep, "name: shop-secrets", "name: shop-secret"}}, "Deployment shop: container shop: envFrom: no Secret shop-secret in the manifests"},
		{"job migrates beside the seed", []edit{{job, "      containers:\n", ""}, {job, "      initContainers:\n", "      containers:\n"}},
			"Job shop-setup: 2 containers; want one"},
		{"job on another image", []edit{{job, "          image: shop\n          imagePullPolicy: IfNotPresent\n          args: [\"migrate\"]",
			"          image: busybox\n          imagePullPolicy: IfNotPresent\n          args: [\"migrate\"]"}}, "container migrate runs busybox, not the replicas' image shop:local"},
		{"job never cleaned up", []edit{{job, "  ttlSecondsAfterFinished: 3600\n", ""}}, "no ttlSecondsAfterFinished"},
		{"budget evicts unready pods", []edit{{"pdb.yaml", "unhealthyPodEvictionPolicy: IfHealthyBudget", "unhealthyPodEvictionPolicy: AlwaysAllow"}},
			"PodDisruptionBudget shop: unhealthyPodEvictionPolicy AlwaysAllow; want IfHealthyBudget"},
		{"readiness on the admin port", []edit{{dep, "path: /readyz\n              port: http", "path: /readyz\n              port: admin"}}, "readinessProbe: port admin is not 8080"},
		{"service sends to the admin port", []edit{{"service.yaml", "targetPort: http", "targetPort: admin"}}, "targetPort admin is not 8080"},
		{"admin port not declared", []edit{{dep, "            - name: admin\n              containerPort: 9091\n", ""}}, "container shop: want a port named admin, 9091"},
		{"scraped on the public port", []edit{{dep, `prometheus.io/port: "9091"`, `prometheus.io/port: "8080"`}}, `annotation prometheus.io/port is "8080"; want 9091`},
		{"not scraped", []edit{{dep, `prometheus.io/scrape: "true"`, `prometheus.io/scrape: "false"`}}, `annotation prometheus.io/scrape is "false"`},
		{"admin on the loopback", []edit{{conf, "SHOP_ADMIN_ADDR=:9091", "SHOP_ADMIN_ADDR=127.0.0.1:9091"}}, "is on the loopback, out of Prometheus's reach"},
		{"admin left at its default", []edit{{conf, "SHOP_ADMIN_ADDR=:9091\n", ""}}, "the operators' listener, which serves /metrics"},
		{"admin on the public port", []edit{{conf, "SHOP_ADMIN_ADDR=:9091", "SHOP_ADMIN_ADDR=:8080"}}, "SHOP_ADMIN_ADDR and SHOP_HTTP_ADDR share port 8080"},
		{"payment secret left empty", []edit{fillJWTSecret}, emptySecret},
		{"payment secret in the ConfigMap", []edit{
			{conf, "SHOP_PAYMENTS=webhook\n", "SHOP_PAYMENTS=webhook\nSHOP_PAYMENT_WEBHOOK_SECRET=" + testSecret + "\n"},
			{"secret.env", "SHOP_PAYMENT_WEBHOOK_SECRET=\n", ""},
		}, "SHOP_PAYMENT_WEBHOOK_SECRET comes from ConfigMap"},
		{"payment secret without whsec_", []edit{{"secret.env", "SHOP_PAYMENT_WEBHOOK_SECRET=\n", "SHOP_PAYMENT_WEBHOOK_SECRET=" + strings.TrimPrefix(testSecret, "whsec_") + "\n"}},
			"SHOP_PAYMENT_WEBHOOK_SECRET: secret 1 does not begin with whsec_"},
		{"payment secret not base64", []edit{{"secret.env", "SHOP_PAYMENT_WEBHOOK_SECRET=\n", "SHOP_PAYMENT_WEBHOOK_SECRET=whsec_not-base64!\n"}},
			"SHOP_PAYMENT_WEBHOOK_SECRET: secret 1 is not whsec_ and standard base64"},
		{"payment secret too short", []edit{{"secret.env", "SHOP_PAYMENT_WEBHOOK_SECRET=\n", "SHOP_PAYMENT_WEBHOOK_SECRET=" + testSecret + ",whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 16)) + "\n"}},
			"SHOP_PAYMENT_WEBHOOK_SECRET: secret 2 decodes to 16 bytes; shop wants at least 24"},
		{"unknown payment provider", []edit{fillSecret, {conf, "SHOP_PAYMENTS=webhook", "SHOP_PAYMENTS=paypal"}}, `SHOP_PAYMENTS="paypal": shop takes payments from webhook (Standard Webhooks) or stripe`},
		{"stripe without its keys", []edit{fillSecret, {conf, "SHOP_PAYMENTS=webhook", "SHOP_PAYMENTS=stripe"}}, "SHOP_STRIPE_SECRET_KEY is empty: with SHOP_PAYMENTS=stripe"},
		{"buyers not authenticated", []edit{fillSecret, {conf, "SHOP_AUTH=jwt\n", "SHOP_AUTH=none\n"}}, `SHOP_AUTH="none": a shipped deployment authenticates its buyers`},
		{"auth left at its default", []edit{fillSecret, fillJWTSecret, {conf, "SHOP_AUTH=jwt\n", ""}}, `SHOP_AUTH="": a shipped deployment authenticates its buyers`},
		{"token secret left empty", []edit{fillSecret}, emptyJWTSecret},
		{"token secret too short", []edit{fillSecret, {"secret.env", "SHOP_JWT_SECRET=\n", "SHOP_JWT_SECRET=short-secret-of-24-bytes\n"}}, "SHOP_JWT_SECRET has 24 bytes; shop wants at least 32"},
		{"token secret and keys", []edit{fillSecret, fillJWTSecret, {conf, "SHOP_AUTH=jwt\n", "SHOP_AUTH=jwt\nSHOP_JWT_PUBLIC_KEYS=/keys/jwt.pem\n"}}, "SHOP_JWT_SECRET and SHOP_JWT_PUBLIC_KEYS are both set"},
		{"token secret in the ConfigMap", []edit{fillSecret, {conf, "SHOP_AUTH=jwt\n", "SHOP_AUTH=jwt\nSHOP_JWT_SECRET=" + testJWTSecret + "\n"}, {"secret.env", "SHOP_JWT_SECRET=\n", ""}},
			"SHOP_JWT_SECRET comes from ConfigMap"},
		{"no audience", []edit{fillSecret, fillJWTSecret, {conf, "SHOP_JWT_AUDIENCE=shop\n", ""}}, "SHOP_JWT_AUDIENCE is not set"},
		{"no issuer", []edit{fillSecret, fillJWTSecret, {conf, "SHOP_JWT_ISSUER=https://auth.example.com/\n", ""}}, "SHOP_JWT_ISSUER is not set"},
		{"trusted proxies left at loopback", []edit{fillSecret, fillJWTSecret, {conf, "SHOP_TRUSTED_PROXIES=10.244.0.0/16\n", ""}}, `SHOP_TRUSTED_PROXIES is "": set it to the proxies in front`},
		{"trusted proxies loopback", []edit{fillSecret, fillJWTSecret, {conf, "SHOP_TRUSTED_PROXIES=10.244.0.0/16", "SHOP_TRUSTED_PROXIES=127.0.0.0/8,::1"}}, "trusts loopback alone"},
		{"no network policy", []edit{fillSecret, fillJWTSecret, {"kustomization.yaml", "  - networkpolicy.yaml\n", ""}}, "no NetworkPolicy selects the replicas' pods for ingress: the operators' port 9091"},
		{"policy selects other pods", []edit{fillSecret, fillJWTSecret, {netpol, "  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: shop\n      app.kubernetes.io/component: server",
			"  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: shop\n      app.kubernetes.io/component: setup"}}, "no NetworkPolicy selects the replicas' pods"},
		{"admin port from anywhere", []edit{fillSecret, fillJWTSecret, {netpol, "    - ports:\n        - port: http\n", "    - ports:\n        - port: http\n        - port: admin\n"}},
			"ingress rule 1 admits the operators' port 9091 from anywhere"},
		{"every port from anywhere", []edit{fillSecret, fillJWTSecret, {netpol, "    - ports:\n        - port: http\n          protocol: TCP\n", "    - {}\n"}},
			"ingress rule 1 admits the operators' port 9091 from anywhere"},
		{"admin port by number from the cluster", []edit{fillSecret, fillJWTSecret, {netpol, "              kubernetes.io/metadata.name: monitoring\n      ports:\n        - port: admin",
			"              kubernetes.io/metadata.name: monitoring\n        - ipBlock:\n            cidr: 10.0.0.0/8\n      ports:\n        - port: 9091"}},
			"ingress rule 2 admits the operators' port 9091 from ipBlock 10.0.0.0/8"},
		{"admin port from every namespace", []edit{fillSecret, fillJWTSecret, {netpol, "        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: monitoring\n",
			"        - namespaceSelector: {}\n"}}, "ingress rule 2 admits the operators' port 9091 from namespaceSelector <none>"},
		{"public port closed", []edit{fillSecret, fillJWTSecret, {netpol, "        - port: http\n", "        - port: 8443\n"}}, "no NetworkPolicy admits the public port 8080 from anywhere"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantRejected(t, checkK8sCopy(t, svc, tc.edits...), tc.want)
		})
	}
}

// An unknown kind is an error that says so: a new kind needs its checks.
func TestK8sRejectsUnknownKind(t *testing.T) {
	files := k8sFiles(t)
	dir := brokenCopy(t, filepath.Join(repoDir, "deploy/k8s"), files, []edit{{"kustomization.yaml", "  - pdb.yaml\n", "  - pdb.yaml\n  - ingress.yaml\n"}})
	ingress := "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: shop\nspec:\n  defaultBackend:\n    service:\n      name: shop\n      port:\n        number: 80\n"
	if err := os.WriteFile(filepath.Join(dir, "ingress.yaml"), []byte(ingress), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := validate.Render(dir)
	if !errors.Is(err, validate.ErrUnknownKind) {
		t.Fatalf("Render: %v; want %v", err, validate.ErrUnknownKind)
	}
	t.Logf("rejected: %v", err)
}

// composeFiles are the files a compose check reads.
var composeFiles = []string{"docker-compose.yml", "deploy/nginx.conf"}

// composeEnv is the environment docker compose is run in: the payment
// provider's secret and the buyers' token secret, which docker-compose.yml
// requires.
var composeEnv = map[string]string{"SHOP_PAYMENT_WEBHOOK_SECRET": testSecret, "SHOP_JWT_SECRET": testJWTSecret}

// TestCompose loads docker-compose.yml as docker compose does and checks
// it against the service and the native stack.
func TestCompose(t *testing.T) {
	p, err := validate.LoadCompose(context.Background(), filepath.Join(repo(t), "docker-compose.yml"), composeEnv)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.CheckCompose(p, repo(t), service(t)); err != nil {
		t.Fatal(err)
	}
}

// docker-compose.yml requires the payment provider's secret and the
// buyers' token secret: without either, docker compose refuses to start
// the stack, and the validation refuses a value that shop would refuse. A
// copy that makes a secret optional is refused when it is not given, for
// shop serve would not start.
func TestComposeNeedsSecrets(t *testing.T) {
	cases := []struct {
		name, required, short, shortWant, emptyWant string
	}{
		{"SHOP_PAYMENT_WEBHOOK_SECRET", "the payment provider's signing secret, whsec_ and base64 of at least 24 bytes",
			"whsec_c2hvcnQ=", "x-shop-env: SHOP_PAYMENT_WEBHOOK_SECRET: secret 1 decodes to 5 bytes", emptySecret},
		{"SHOP_JWT_SECRET", "the secret buyers' tokens are signed with (HS256), at least 32 bytes",
			"too-short", "x-shop-env: SHOP_JWT_SECRET has 9 bytes; shop wants at least 32", emptyJWTSecret},
	}
	file := filepath.Join(repo(t), "docker-compose.yml")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := maps.Clone(composeEnv)
			delete(env, tc.name)
			_, err := validate.LoadCompose(context.Background(), file, env)
			wantRejected(t, err, "required variable "+tc.name+" is missing a value")

			env[tc.name] = tc.short
			p, err := validate.LoadCompose(context.Background(), file, env)
			if err != nil {
				t.Fatal(err)
			}
			wantRejected(t, validate.CheckCompose(p, repo(t), service(t)), tc.shortWant)

			delete(env, tc.name)
			dir := brokenCopy(t, repo(t), composeFiles, []edit{{"docker-compose.yml",
				`"${` + tc.name + `:?` + tc.required + `: see the top of docker-compose.yml}"`, `"${` + tc.name + `:-}"`}})
			if p, err = validate.LoadCompose(context.Background(), filepath.Join(dir, "docker-compose.yml"), env); err != nil {
				t.Fatal(err)
			}
			wantRejected(t, validate.CheckCompose(p, dir, service(t)), "x-shop-env: "+tc.emptyWant)
		})
	}
}

// TestComposeRejectsBrokenCopies breaks a copy of docker-compose.yml (and
// the nginx template beside it) in one way per case and expects the
// validation to reject it, naming the problem: the schema, and each check.
func TestComposeRejectsBrokenCopies(t *testing.T) {
	const dc = "docker-compose.yml"
	svc := service(t)
	cases := []brokenCase{
		{"unknown key", []edit{{dc, "stop_grace_period: 40s", "stop_grace_perod: 40s"}}, "stop_grace_perod"},
		{"wrong type", []edit{{dc, "      retries: 60\n", "      retries: sixty\n"}}, "retries"},
		{"undefined dependency", []edit{{dc, "      shop3: {condition: service_healthy}", "      shop4: {condition: service_healthy}"}}, "shop4"},
		{"a replica's own environment", []edit{{dc, "  shop3: *shop\n", "  shop3:\n    <<: *shop\n    environment:\n      <<: *shop-env\n      SHOP_LOCK_MODE: local\n"}},
			`service shop3: its environment differs from x-shop-env: SHOP_LOCK_MODE="local", not "redis"`},
		{"setup on another database", []edit{{dc, "    environment: *shop-env\n    entrypoint:", "    environment:\n      <<: *shop-env\n      SHOP_MYSQL_DSN: root:shop@tcp(mysql:3306)/other\n    entrypoint:"}},
			"service setup: its environment differs"},
		{"setting shop does not read", []edit{{dc, "  SHOP_LOCK_MODE: redis\n", "  SHOP_LOCK_MODE: redis\n  SHOP_LOCKMODE: redlock\n"}}, "SHOP_LOCKMODE: not a setting shop reads"},
		{"grace too short", []edit{{dc, "stop_grace_period: 40s", "stop_grace_period: 20s"}}, "stop_grace_period 20s is less than SHOP_DRAIN 5s + shutdown 30s"},
		{"drain raised, grace not", []edit{{dc, "  SHOP_LOCK_MODE: redis\n", "  SHOP_LOCK_MODE: redis\n  SHOP_DRAIN: 20s\n"}}, "SHOP_DRAIN 20s + shutdown 30s"},
		{"replica missing upstream", []edit{{dc, " server shop3:8080 max_fails=1 fail_timeout=2s;", ""}}, "SHOP_UPSTREAMS names [shop1 shop2]; want every replica once: [shop1 shop2 shop3]"},
		{"upstream on another port", []edit{{dc, "server shop2:8080", "server shop2:8081"}}, "shop2:8081 is not on port 8080"},
		{"template mounted as the config", []edit{{dc, "/etc/nginx/templates/nginx.conf.template:ro", "/etc/nginx/nginx.conf:ro"}}, "want it read-only in /etc/nginx/templates/"},
		{"template written elsewhere", []edit{{dc, "      NGINX_ENVSUBST_OUTPUT_DIR: /etc/nginx\n", ""}}, "nginx reads /etc/nginx/nginx.conf"},
		{"another template", []edit{{dc, "./deploy/nginx.conf:", "./deploy/nginx-docker.conf:"}}, "no service mounts deploy/nginx.conf"},
		{"template variable unset", []edit{{dc, "      NGINX_LOG_DIR: /var/log/nginx\n", ""}}, "NGINX_LOG_DIR is not set"},
		{"template variable added", []edit{{"deploy/nginx.conf", "worker_processes auto;", "worker_processes ${NGINX_WORKERS};"}}, "NGINX_WORKERS is not set"},
		{"listen port not published", []edit{{dc, `NGINX_LISTEN: "8080"`, `NGINX_LISTEN: "9090"`}}, "no published port targets 9090"},
		{"seed runs after a failed migrate", []edit{{dc, "shop migrate && shop seed", "shop migrate; shop seed"}}, "no setup service"},
		{"setup resets the catalog", []edit{{dc, "shop seed --if-empty", "shop seed"}}, "service setup: runs shop seed without --if-empty"},
		{"replica's health check off", []edit{{dc, "  shop3: *shop\n", "  shop3:\n    <<: *shop\n    healthcheck:\n      disable: true\n"}},
			"service shop3: its healthcheck is disabled"},
		{"replica's health check on a fixed port", []edit{{dc, "  shop3: *shop\n", "  shop3:\n    <<: *shop\n    healthcheck:\n      test: [\"CMD\", \"wget\", \"-q\", \"-O\", \"/dev/null\", \"http://127.0.0.1:8080/readyz\"]\n"}},
			"service shop3: healthcheck"},
		{"nginx's health check on another port", []edit{{dc, `"http://127.0.0.1:8080/readyz"]`, `"http://127.0.0.1:8081/readyz"]`}}, "the healthcheck asks port 8081; nginx listens on 8080"},
		{"replicas do not wait for the setup", []edit{{dc, "      condition: service_completed_successfully\n", "      condition: service_started\n"}}, "service shop1: does not wait for the setup"},
		{"unknown payment provider", []edit{{dc, "  SHOP_PAYMENTS: webhook\n", "  SHOP_PAYMENTS: paypal\n"}}, `x-shop-env: SHOP_PAYMENTS="paypal"`},
		{"buyers not authenticated", []edit{{dc, "  SHOP_AUTH: jwt\n", "  SHOP_AUTH: none\n"}}, `x-shop-env: SHOP_AUTH="none": a shipped deployment authenticates its buyers`},
		{"no audience", []edit{{dc, "  SHOP_JWT_AUDIENCE: shop\n", ""}}, "x-shop-env: SHOP_JWT_AUDIENCE is not set"},
		{"trusted proxies left at loopback", []edit{{dc, "  SHOP_TRUSTED_PROXIES: 172.30.80.10\n", ""}}, `x-shop-env: SHOP_TRUSTED_PROXIES is ""`},
		{"trusts another address", []edit{{dc, "  SHOP_TRUSTED_PROXIES: 172.30.80.10\n", "  SHOP_TRUSTED_PROXIES: 172.30.80.11\n"}},
			"SHOP_TRUSTED_PROXIES=172.30.80.11 does not name nginx's address, 172.30.80.10"},
		{"nginx without a fixed address", []edit{{dc, "    networks:\n      default:\n        ipv4_address: 172.30.80.10\n", ""}},
			"nginx has no fixed address on the replicas' network"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := brokenCopy(t, repo(t), composeFiles, tc.edits)
			p, err := validate.LoadCompose(context.Background(), filepath.Join(dir, "docker-compose.yml"), composeEnv)
			if err == nil {
				err = validate.CheckCompose(p, dir, svc)
			}
			wantRejected(t, err, tc.want)
		})
	}
}
