package validate

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// LoadCompose loads a compose file with compose-go, the loader docker
// compose uses: validated against the Compose schema (an unknown key is an
// error), interpolated, normalized and checked for consistency (a
// depends_on naming no service, say). The environment is env alone, so a
// ${VAR:-default} takes its default whatever the caller's environment,
// and a required ${VAR:?…} that env does not give is an error, as docker
// compose refuses to start without it.
func LoadCompose(ctx context.Context, file string, env map[string]string) (*types.Project, error) {
	var vars []string
	for k, v := range env {
		vars = append(vars, k+"="+v)
	}
	opts, err := cli.NewProjectOptions([]string{file},
		cli.WithName("shop"),
		cli.WithWorkingDirectory(filepath.Dir(file)),
		cli.WithEnv(vars),
		cli.WithInterpolation(true),
		cli.WithNormalization(true),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		return nil, fmt.Errorf("validate: %w", err)
	}
	p, err := opts.LoadProject(ctx)
	if err != nil {
		return nil, fmt.Errorf("validate: %s: %w", file, err)
	}
	return p, nil
}

const (
	// sharedEnvKey is the compose file's extension that every shop service
	// takes its environment from.
	sharedEnvKey = "x-shop-env"
	// nginxTemplate is the nginx template of the native stack, relative
	// to the repository.
	nginxTemplate = "deploy/nginx.conf"
	// nginxTemplateDir is where the nginx image looks for templates, and
	// nginxConf the file nginx reads.
	nginxTemplateDir = "/etc/nginx/templates/"
	nginxConf        = "/etc/nginx/nginx.conf"
)

var (
	// templateVar is a ${NAME} of the nginx template, filled in from the
	// environment (nginx's own variables are $lowercase, without braces).
	templateVar = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)
	// upstreamServer is a server line of SHOP_UPSTREAMS.
	upstreamServer = regexp.MustCompile(`\bserver\s+([^\s;]+)`)
	// namedPort is a port a command names, as in host:port or a URL.
	namedPort = regexp.MustCompile(`:(\d+)\b`)
)

// CheckCompose checks a compose project of the repository at repo against
// the service and the native stack: every shop service (built from the
// repository) has the environment of x-shop-env, made only of settings
// the service reads, the payment provider's secrets among them
// (checkPayments); a setup service migrates and then seeds an empty
// catalog only (shop seed --if-empty), and the replicas wait for it; a replica is given time to drain and shut down
// before it is killed; nginx runs the native stack's template, every
// variable of it set, with every replica, and only them, as upstreams on
// the port they listen on.
func CheckCompose(p *types.Project, repo string, svc Service) error {
	var pr problems
	shared, err := sharedEnv(p)
	if err != nil {
		pr.addf("%v", err)
		return pr.err()
	}
	if unknown := svc.unknownEnv(shared); len(unknown) > 0 {
		pr.addf("%s: %s: not a setting shop reads (cmd/shop)", sharedEnvKey, strings.Join(unknown, ", "))
	}
	drain, err := svc.drain(shared)
	if err != nil {
		pr.addf("%s: %v", sharedEnvKey, err)
	}
	port, err := svc.listenPort(shared)
	if err != nil {
		pr.addf("%s: %v", sharedEnvKey, err)
	}
	svc.checkPayments(&pr, sharedEnvKey, shared)
	checkAuth(&pr, sharedEnvKey, shared)

	var replicas, setups []string
	for _, name := range slices.Sorted(maps.Keys(p.Services)) {
		s := p.Services[name]
		if !builtFrom(s, repo) {
			continue
		}
		env := serviceEnv(s)
		if !maps.Equal(env, shared) {
			pr.addf("service %s: its environment differs from %s: %s", name, sharedEnvKey, envDiff(env, shared))
		}
		cmd := slices.Concat(s.Entrypoint, s.Command)
		switch {
		case servesShop(s):
			replicas = append(replicas, name)
			if need := drain + svc.Shutdown; s.StopGracePeriod == nil || time.Duration(*s.StopGracePeriod) < need {
				pr.addf("service %s: stop_grace_period %s is less than SHOP_DRAIN %s + shutdown %s = %s", name, graceString(s.StopGracePeriod), drain, svc.Shutdown, need)
			}
			checkReplicaHealth(&pr, name, s.HealthCheck)
		default:
			if seed, ok := setupSeed(shopSteps(cmd)); ok {
				setups = append(setups, name)
				if !seedsIfEmpty(seed) {
					pr.addf("service %s: %s at every `docker compose up`", name, seedWithoutIfEmpty)
				}
			}
		}
	}
	if len(replicas) == 0 {
		pr.addf("no shop replica (a service built from %s that runs shop serve)", repo)
	}
	if len(setups) == 0 {
		pr.addf("no setup service running `shop migrate && shop seed …`")
	}
	for _, r := range replicas {
		if !slices.ContainsFunc(setups, func(s string) bool {
			return p.Services[r].DependsOn[s].Condition == types.ServiceConditionCompletedSuccessfully
		}) {
			pr.addf("service %s: does not wait for the setup (%s) to complete successfully", r, strings.Join(setups, ", "))
		}
	}
	nginxIP := checkNginx(&pr, p, repo, replicas, port)
	if nginxIP == nil {
		pr.addf("nginx has no fixed address on the replicas' network (networks: NAME: ipv4_address) for SHOP_TRUSTED_PROXIES to name")
	}
	checkTrustedProxies(&pr, sharedEnvKey, shared, nginxIP)
	return pr.err()
}

// builtFrom reports whether s is built from the repository at repo: a
// shop service.
func builtFrom(s types.ServiceConfig, repo string) bool {
	return s.Build != nil && filepath.Clean(s.Build.Context) == filepath.Clean(repo)
}

// servesShop reports whether a shop service runs shop serve, the image's
// default command: a replica.
func servesShop(s types.ServiceConfig) bool {
	cmd := slices.Concat(s.Entrypoint, s.Command)
	return len(cmd) == 0 || slices.Equal(cmd, []string{"serve"})
}

// serviceEnv returns a service's environment; a variable without a value
// (taken from the caller's environment, here empty) is left out.
func serviceEnv(s types.ServiceConfig) map[string]string {
	env := map[string]string{}
	for k, v := range s.Environment {
		if v != nil {
			env[k] = *v
		}
	}
	return env
}

// sharedEnv returns x-shop-env, interpolated like the rest of the file.
func sharedEnv(p *types.Project) (map[string]string, error) {
	raw, ok := p.Extensions[sharedEnvKey].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("no %s mapping in the compose file", sharedEnvKey)
	}
	env := map[string]string{}
	for k, v := range raw {
		if v == nil {
			v = ""
		}
		env[k] = fmt.Sprint(v)
	}
	return env, nil
}

// checkNginx checks the nginx service: the native stack's template, every
// variable of it set, the replicas as upstreams on port, and its listen
// port published. It returns nginx's fixed address on a network of the
// replicas, or nil.
func checkNginx(pr *problems, p *types.Project, repo string, replicas []string, port int) net.IP {
	template := filepath.Join(repo, nginxTemplate)
	for _, name := range slices.Sorted(maps.Keys(p.Services)) {
		s := p.Services[name]
		i := slices.IndexFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool {
			return v.Type == types.VolumeTypeBind && filepath.Clean(v.Source) == template
		})
		if i < 0 {
			continue
		}
		where := "service " + name
		v := s.Volumes[i]
		env := serviceEnv(s)
		if !strings.HasPrefix(v.Target, nginxTemplateDir) || !strings.HasSuffix(v.Target, ".template") || !v.ReadOnly {
			pr.addf("%s: mounts %s at %s; want it read-only in %s as NAME.template", where, nginxTemplate, v.Target, nginxTemplateDir)
		}
		out := filepath.Join(env["NGINX_ENVSUBST_OUTPUT_DIR"], strings.TrimSuffix(filepath.Base(v.Target), ".template"))
		if env["NGINX_ENVSUBST_OUTPUT_DIR"] == "" || out != nginxConf {
			pr.addf("%s: the template is written to %s; nginx reads %s (set NGINX_ENVSUBST_OUTPUT_DIR)", where, out, nginxConf)
		}
		text, err := readText(template)
		if err != nil {
			pr.addf("%s: %v", where, err)
			return nil
		}
		for _, name := range templateVars(text) {
			if env[name] == "" {
				pr.addf("%s: %s is not set; %s uses it", where, name, nginxTemplate)
			}
		}
		checkUpstreams(pr, where, env["SHOP_UPSTREAMS"], replicas, port)
		if listen := env["NGINX_LISTEN"]; listen != "" {
			lp := listen[strings.LastIndex(listen, ":")+1:]
			if !slices.ContainsFunc(s.Ports, func(pc types.ServicePortConfig) bool { return strconv.Itoa(int(pc.Target)) == lp }) {
				pr.addf("%s: NGINX_LISTEN=%s, but no published port targets %s", where, listen, lp)
			}
			if h := s.HealthCheck; h != nil && !h.Disable {
				for _, m := range namedPort.FindAllStringSubmatch(strings.Join(h.Test, " "), -1) {
					if m[1] != lp {
						pr.addf("%s: the healthcheck asks port %s; nginx listens on %s (NGINX_LISTEN)", where, m[1], lp)
					}
				}
			}
		}
		return fixedAddress(p, s, replicas)
	}
	pr.addf("no service mounts %s as an nginx template", nginxTemplate)
	return nil
}

// fixedAddress returns s's fixed IPv4 address on a network that every
// replica is on, or nil.
func fixedAddress(p *types.Project, s types.ServiceConfig, replicas []string) net.IP {
	for name, cfg := range s.Networks {
		if cfg == nil || cfg.Ipv4Address == "" {
			continue
		}
		if slices.ContainsFunc(replicas, func(r string) bool {
			_, ok := p.Services[r].Networks[name]
			return !ok
		}) {
			continue
		}
		return net.ParseIP(cfg.Ipv4Address)
	}
	return nil
}

// checkReplicaHealth checks a replica's health check: the image's (none
// of its own), or its own running `shop healthcheck`, which asks the port
// SHOP_HTTP_ADDR names. Disabled, nginx, which waits for the replicas to be
// healthy, would never start; naming a port, it would go on asking that one
// when SHOP_HTTP_ADDR moves the replica.
func checkReplicaHealth(pr *problems, name string, h *types.HealthCheckConfig) {
	switch {
	case h == nil:
	case h.Disable:
		pr.addf("service %s: its healthcheck is disabled; nginx waits for the replicas to be healthy", name)
	case len(h.Test) > 0 && !runsHealthcheck(h.Test):
		pr.addf("service %s: healthcheck %q; want [CMD shop healthcheck], which asks the port SHOP_HTTP_ADDR names (or none, the image's)", name, h.Test)
	}
}

// runsHealthcheck reports whether a compose healthcheck's test runs `shop
// healthcheck` and nothing else.
func runsHealthcheck(test []string) bool {
	want := []string{"shop", "healthcheck"}
	switch {
	case len(test) > 1 && test[0] == "CMD":
		return slices.Equal(test[1:], want)
	case len(test) == 2 && test[0] == "CMD-SHELL":
		return slices.Equal(strings.Fields(test[1]), want)
	}
	return false
}

// templateVars returns the ${NAME}s of an nginx template, comments left
// out.
func templateVars(text string) []string {
	var names []string
	for line := range strings.Lines(text) {
		line, _, _ = strings.Cut(line, "#")
		for _, m := range templateVar.FindAllStringSubmatch(line, -1) {
			if !slices.Contains(names, m[1]) {
				names = append(names, m[1])
			}
		}
	}
	return names
}

// checkUpstreams checks that SHOP_UPSTREAMS names each replica once, on
// port, and nothing else.
func checkUpstreams(pr *problems, where, upstreams string, replicas []string, port int) {
	var hosts []string
	for _, m := range upstreamServer.FindAllStringSubmatch(upstreams, -1) {
		host, p, ok := strings.Cut(m[1], ":")
		if !ok || p != strconv.Itoa(port) {
			pr.addf("%s: SHOP_UPSTREAMS: %s is not on port %d, the one the replicas listen on", where, m[1], port)
		}
		hosts = append(hosts, host)
	}
	slices.Sort(hosts)
	if !slices.Equal(hosts, replicas) {
		pr.addf("%s: SHOP_UPSTREAMS names %v; want every replica once: %v", where, hosts, replicas)
	}
}

// envDiff describes how env differs from want.
func envDiff(env, want map[string]string) string {
	var d []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if v, ok := env[k]; !ok {
			d = append(d, "no "+k)
		} else if v != want[k] {
			d = append(d, fmt.Sprintf("%s=%q, not %q", k, v, want[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if _, ok := want[k]; !ok {
			d = append(d, "extra "+k)
		}
	}
	return strings.Join(d, "; ")
}

// readText returns a file's text.
func readText(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}

func graceString(d *types.Duration) string {
	if d == nil {
		return "unset (10s)"
	}
	return time.Duration(*d).String()
}
