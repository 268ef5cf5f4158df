package validate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

const (
	// prometheusConfig is Prometheus's configuration, relative to the
	// repository, and prometheusConfigPath where the prom/prometheus image
	// reads it unless --config.file says otherwise.
	prometheusConfig     = "deploy/prometheus/prometheus.yml"
	prometheusConfigPath = "/etc/prometheus/prometheus.yml"
	// prometheusRules holds the alerting rules, relative to the
	// repository; prometheus.yml's rule_files names where the Prometheus
	// service mounts it.
	prometheusRules = "deploy/prometheus/alerts.yml"
	// prometheusPort is the port Prometheus listens on (the image's
	// default; --web.listen-address is not set).
	prometheusPort = 9090
	// scrapeInterval is how often Prometheus scrapes the replicas.
	scrapeInterval = 5 * time.Second
	// rangeSamples is how many scrapes a query's range must span at least:
	// a rate over fewer is noise, or nothing when a scrape is missed.
	rangeSamples = 4

	// grafanaProvisioning is Grafana's provisioning directory, relative to
	// the repository, and grafanaProvisioningPath where the grafana image
	// reads it (GF_PATHS_PROVISIONING's default).
	grafanaProvisioning     = "deploy/grafana/provisioning"
	grafanaProvisioningPath = "/etc/grafana/provisioning"
	// grafanaDashboards holds the dashboards' JSON, relative to the
	// repository.
	grafanaDashboards = "deploy/grafana/dashboards"
	// grafanaPort is the port Grafana listens on (the image's default).
	grafanaPort = 3000
	// minSchemaVersion is the oldest dashboard schema accepted: from 36 on,
	// panels and targets name their data source by uid.
	minSchemaVersion = 36
	// gridWidth is the width of a Grafana dashboard's grid.
	gridWidth = 24
)

// syntheticMetrics are the series Prometheus writes for each scrape itself.
var syntheticMetrics = []string{"up", "scrape_duration_seconds", "scrape_samples_scraped"}

// dashboardMetrics are the series the dashboard must show: orders by
// result and busy cause, the lock's waiters, attempts and wakeups, the
// cache's hit ratio, the latency histogram, the batch size, the
// dependency errors, the replicas' readiness and their dependencies'
// answers, and the outbox's events: pending, the oldest pending's age,
// dead, and deliveries by result (docs/events.md).
var dashboardMetrics = []string{
	"shop_orders_total", "shop_orders_busy_total",
	"shop_lock_waiting", "shop_lock_attempts_total", "shop_lock_wakeups_total",
	"shop_cache_hits_total", "shop_cache_null_hits_total", "shop_cache_misses_total",
	"shop_http_request_duration_seconds_bucket",
	"shop_order_transaction_orders_total", "shop_order_transactions_total",
	"shop_dependency_errors_total",
	"shop_ready", "shop_dependency_up",
	"shop_events_pending", "shop_events_oldest_pending_seconds", "shop_events_dead", "shop_events_deliveries_total",
}

// alertMetrics are the series the alerting rules must watch: the refunds
// by state, whose failed ones nothing retries and an operator must pay
// back by hand (docs/payments.md); the age of the oldest lapsed
// reservation, whose unit a sweep that is behind or failing keeps out of
// the sale (docs/lifecycle.md); and the age of the oldest event not delivered,
// and the dead events, which nothing sends again until an operator
// redelivers them (docs/events.md).
var alertMetrics = []string{"shop_refunds_total", "shop_oldest_lapsed_reservation_seconds",
	"shop_events_oldest_pending_seconds", "shop_events_dead"}

// panelTypes are the Grafana core panels a dashboard may use.
var panelTypes = []string{"timeseries", "stat", "gauge", "bargauge", "table", "text"}

// CheckMonitoring checks the compose stack's Prometheus and Grafana: a
// service mounts deploy/prometheus/prometheus.yml where Prometheus reads
// it, the configuration decodes strictly and scrapes exactly the shop
// replicas, on the port of their operators' listener (SHOP_ADMIN_ADDR),
// which they do not publish, every 5s; its rule files are mounted from
// the repository, deploy/prometheus/alerts.yml among them, decode strictly,
// and their alerts' queries are checked as the dashboards' are, and
// together watch what alertMetrics lists; a service mounts
// Grafana's provisioning, whose Prometheus data source reaches that
// service, and whose dashboard provider reads a mount of
// deploy/grafana/dashboards; each dashboard there decodes strictly, its
// panels use the provisioned data source by uid, its queries parse as
// PromQL, name only series shop exports (metrics) and span enough scrapes,
// and together show what dashboardMetrics lists. Both services are
// published on the loopback only, and an anonymous Grafana user only
// views.
func CheckMonitoring(p *types.Project, repo string, svc Service, metrics Metrics) error {
	var pr problems
	var targets []string
	for _, name := range slices.Sorted(maps.Keys(p.Services)) {
		s := p.Services[name]
		if !builtFrom(s, repo) || !servesShop(s) {
			continue
		}
		port, err := svc.adminPort(serviceEnv(s))
		if err != nil {
			pr.addf("service %s: %v", name, err)
			continue
		}
		if slices.ContainsFunc(s.Ports, func(pc types.ServicePortConfig) bool { return int(pc.Target) == port }) {
			pr.addf("service %s: publishes port %d, the operators' listener (SHOP_ADMIN_ADDR): the admin API and the metrics are for the compose network only", name, port)
		}
		targets = append(targets, hostPort(name, port))
	}
	prom, ok := mountingService(&pr, p, filepath.Join(repo, prometheusConfig))
	if !ok {
		return pr.err()
	}
	checkPrometheus(&pr, p.Services[prom], repo, targets, metrics)
	graf, ok := mountingService(&pr, p, filepath.Join(repo, grafanaProvisioning))
	if !ok {
		return pr.err()
	}
	checkGrafana(&pr, p.Services[graf], repo, prom, metrics)
	return pr.err()
}

// hostPort is host:port.
func hostPort(host string, port int) string { return host + ":" + strconv.Itoa(port) }

// mountingService returns the one service that bind-mounts source.
func mountingService(pr *problems, p *types.Project, source string) (string, bool) {
	var names []string
	for _, name := range slices.Sorted(maps.Keys(p.Services)) {
		if _, ok := bindMount(p.Services[name], source); ok {
			names = append(names, name)
		}
	}
	if len(names) != 1 {
		pr.addf("%d services mount %s; want one", len(names), source)
		return "", false
	}
	return names[0], true
}

// bindMount returns s's read-only bind mount of source, and whether it has
// one (read-only or not).
func bindMount(s types.ServiceConfig, source string) (types.ServiceVolumeConfig, bool) {
	i := slices.IndexFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool {
		return v.Type == types.VolumeTypeBind && filepath.Clean(v.Source) == filepath.Clean(source)
	})
	if i < 0 {
		return types.ServiceVolumeConfig{}, false
	}
	return s.Volumes[i], true
}

// checkLoopback checks that s publishes port, and every port it publishes
// only on the loopback.
func checkLoopback(pr *problems, s types.ServiceConfig, port int) {
	if !slices.ContainsFunc(s.Ports, func(pc types.ServicePortConfig) bool { return int(pc.Target) == port }) {
		pr.addf("service %s: publishes no port %d", s.Name, port)
	}
	for _, pc := range s.Ports {
		if pc.HostIP != "127.0.0.1" {
			pr.addf("service %s: port %d is published on %q; want 127.0.0.1 only", s.Name, pc.Target, pc.HostIP)
		}
	}
}

// promConfig is the part of Prometheus's configuration the stack uses;
// anything else is refused, a misspelt key included.
type promConfig struct {
	Global        promGlobal     `json:"global"`
	RuleFiles     []string       `json:"rule_files,omitempty"`
	ScrapeConfigs []scrapeConfig `json:"scrape_configs"`
}

type promGlobal struct {
	ScrapeInterval     string `json:"scrape_interval,omitempty"`
	ScrapeTimeout      string `json:"scrape_timeout,omitempty"`
	EvaluationInterval string `json:"evaluation_interval,omitempty"`
}

type scrapeConfig struct {
	JobName        string         `json:"job_name"`
	ScrapeInterval string         `json:"scrape_interval,omitempty"`
	ScrapeTimeout  string         `json:"scrape_timeout,omitempty"`
	MetricsPath    string         `json:"metrics_path,omitempty"`
	Scheme         string         `json:"scheme,omitempty"`
	StaticConfigs  []staticConfig `json:"static_configs"`
}

type staticConfig struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// Prometheus's defaults.
const (
	defaultScrapeInterval = time.Minute
	defaultScrapeTimeout  = 10 * time.Second
)

// duration parses a Prometheus duration, def when it is empty.
func duration(v string, def time.Duration) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := model.ParseDuration(v)
	return time.Duration(d), err
}

// readYAML decodes a YAML file strictly into v: an unknown or repeated key
// is an error.
func readYAML(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// checkPrometheus checks the Prometheus service s and its configuration:
// it scrapes /metrics of exactly targets (the replicas' operators'
// listeners), every scrapeInterval, and loads rules that checkRules
// accepts.
func checkPrometheus(pr *problems, s types.ServiceConfig, repo string, targets []string, metrics Metrics) {
	where := "service " + s.Name
	checkLoopback(pr, s, prometheusPort)
	v, _ := bindMount(s, filepath.Join(repo, prometheusConfig))
	want := prometheusConfigPath
	for _, arg := range slices.Concat(s.Entrypoint, s.Command) {
		if f, ok := strings.CutPrefix(arg, "--config.file="); ok {
			want = f
		}
	}
	if v.Target != want || !v.ReadOnly {
		pr.addf("%s: mounts %s at %s; Prometheus reads %s (want it read-only)", where, prometheusConfig, v.Target, want)
	}
	var c promConfig
	if err := readYAML(filepath.Join(repo, prometheusConfig), &c); err != nil {
		pr.addf("%v", err)
		return
	}
	global, err := duration(c.Global.ScrapeInterval, defaultScrapeInterval)
	if err != nil {
		pr.addf("%s: global scrape_interval: %v", prometheusConfig, err)
	}
	var scraped []string
	for _, sc := range c.ScrapeConfigs {
		job := fmt.Sprintf("%s: job %q", prometheusConfig, sc.JobName)
		interval, err := duration(sc.ScrapeInterval, global)
		if err != nil {
			pr.addf("%s: scrape_interval: %v", job, err)
		} else if interval != scrapeInterval {
			pr.addf("%s: scrapes every %s; want %s", job, interval, scrapeInterval)
		}
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			pr.addf("%s: metrics_path %s; shop serves /metrics", job, sc.MetricsPath)
		}
		if sc.Scheme != "" && sc.Scheme != "http" {
			pr.addf("%s: scheme %s; the replicas serve http", job, sc.Scheme)
		}
		for _, st := range sc.StaticConfigs {
			scraped = append(scraped, st.Targets...)
		}
	}
	slices.Sort(scraped)
	if !slices.Equal(scraped, targets) {
		pr.addf("%s: scrapes %v; want every shop replica once, on the port of its operators' listener (SHOP_ADMIN_ADDR): %v", prometheusConfig, scraped, targets)
	}
	checkRules(pr, s, repo, want, c.RuleFiles, metrics)
}

// promRules is a Prometheus rules file, as far as the stack uses one:
// groups of alerting rules. Anything else is refused, a recording rule or
// a misspelt key included.
type promRules struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string      `json:"name"`
	Interval string      `json:"interval,omitempty"`
	Rules    []alertRule `json:"rules"`
}

type alertRule struct {
	Alert         string            `json:"alert"`
	Expr          string            `json:"expr"`
	For           string            `json:"for,omitempty"`
	KeepFiringFor string            `json:"keep_firing_for,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// checkRules checks the rule files of the configuration at configPath in
// the Prometheus service s: each names a file, not a pattern, that s
// mounts read-only from the repository, and prometheusRules is among them;
// each decodes strictly and its alerts pass checkAlert; together they
// watch what alertMetrics lists.
func checkRules(pr *problems, s types.ServiceConfig, repo, configPath string, files []string, metrics Metrics) {
	alerts, watched := map[string]bool{}, map[string]bool{}
	loaded := false
	for _, f := range files {
		where := fmt.Sprintf("%s: rule_files %s", prometheusConfig, f)
		if strings.ContainsAny(f, "*?[") {
			pr.addf("%s: a pattern; name each rules file, so that each is checked", where)
			continue
		}
		// Prometheus reads a relative path from its configuration's
		// directory.
		target := f
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(configPath), target)
		}
		i := slices.IndexFunc(s.Volumes, func(v types.ServiceVolumeConfig) bool {
			return v.Type == types.VolumeTypeBind && filepath.Clean(v.Target) == filepath.Clean(target)
		})
		if i < 0 {
			pr.addf("%s: service %s mounts no file of the repository at %s", where, s.Name, target)
			continue
		}
		v := s.Volumes[i]
		rel, err := filepath.Rel(repo, v.Source)
		if err != nil || !filepath.IsLocal(rel) {
			pr.addf("%s: service %s mounts %s there, which is not in the repository", where, s.Name, v.Source)
			continue
		}
		if !v.ReadOnly {
			pr.addf("%s: service %s mounts %s there read-write; want it read-only", where, s.Name, filepath.ToSlash(rel))
		}
		loaded = loaded || filepath.ToSlash(rel) == prometheusRules
		checkRulesFile(pr, v.Source, filepath.ToSlash(rel), metrics, alerts, watched)
	}
	if !loaded {
		pr.addf("%s: rule_files does not load %s, the alerts, from where service %s mounts it", prometheusConfig, prometheusRules, s.Name)
	}
	for _, m := range alertMetrics {
		if !watched[m] {
			pr.addf("%s: no alert watches %s", prometheusRules, m)
		}
	}
}

// checkRulesFile checks the rules file at path, named name: strictly
// decoded, groups of their own names, each with rules, every one an alert
// that checkAlert accepts. It adds the alerts' names to alerts and the
// series their queries name to watched.
func checkRulesFile(pr *problems, path, name string, metrics Metrics, alerts, watched map[string]bool) {
	var c promRules
	if err := readYAML(path, &c); err != nil {
		pr.addf("%v", err)
		return
	}
	if len(c.Groups) == 0 {
		pr.addf("%s: no rule group", name)
	}
	groups := map[string]bool{}
	for _, g := range c.Groups {
		where := fmt.Sprintf("%s: group %q", name, g.Name)
		if g.Name == "" || groups[g.Name] {
			pr.addf("%s: a group needs a name of its own", where)
		}
		groups[g.Name] = true
		if _, err := duration(g.Interval, 0); err != nil {
			pr.addf("%s: interval: %v", where, err)
		}
		if len(g.Rules) == 0 {
			pr.addf("%s: no rule", where)
		}
		for _, r := range g.Rules {
			checkAlert(pr, where, r, metrics, alerts, watched)
		}
	}
}

// checkAlert checks one alerting rule: a name of its own, a query that
// checkQuery accepts, durations that parse, a summary, and label and
// annotation templates that parse as Prometheus parses them.
func checkAlert(pr *problems, group string, r alertRule, metrics Metrics, alerts, watched map[string]bool) {
	where := fmt.Sprintf("%s: alert %q", group, r.Alert)
	if r.Alert == "" || alerts[r.Alert] {
		pr.addf("%s: an alert needs a name of its own", where)
	}
	alerts[r.Alert] = true
	checkQuery(pr, where, r.Expr, metrics, watched)
	if _, err := duration(r.For, 0); err != nil {
		pr.addf("%s: for: %v", where, err)
	}
	if _, err := duration(r.KeepFiringFor, 0); err != nil {
		pr.addf("%s: keep_firing_for: %v", where, err)
	}
	if r.Annotations["summary"] == "" {
		pr.addf("%s: no summary annotation: an alert says what happened", where)
	}
	for _, kind := range []struct {
		name string
		m    map[string]string
	}{{"label", r.Labels}, {"annotation", r.Annotations}} {
		for _, k := range slices.Sorted(maps.Keys(kind.m)) {
			if err := parseAlertTemplate(kind.m[k]); err != nil {
				pr.addf("%s: %s %s: %v", where, kind.name, k, err)
			}
		}
	}
}

// alertTemplateDefs are the variables Prometheus defines before each label
// and annotation template of an alert (rulefmt's testTemplateParsing).
const alertTemplateDefs = "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}"

// alertTemplateFuncs are the functions an alert's templates may call, from
// Prometheus's template package; parsing a template needs their names
// only.
var alertTemplateFuncs = []string{
	"query", "first", "label", "value", "strvalue", "args", "reReplaceAll", "safeHtml", "match", "title",
	"toUpper", "toLower", "graphLink", "tableLink", "sortByLabel", "stripPort", "stripDomain", "humanize",
	"humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp", "toTime", "toDuration",
	"now", "pathPrefix", "externalURL", "parseDuration", "urlQueryEscape",
}

// parseAlertTemplate parses text as Prometheus parses an alert's label or
// annotation when it loads the rules, which it refuses on an error: an
// unknown variable or function, a broken action.
func parseAlertTemplate(text string) error {
	funcs := template.FuncMap{}
	for _, name := range alertTemplateFuncs {
		funcs[name] = func(...any) any { return nil }
	}
	_, err := template.New("alert").Funcs(funcs).Parse(alertTemplateDefs + text)
	return err
}

// grafanaDatasources is a data source provisioning file.
type grafanaDatasources struct {
	APIVersion  int                 `json:"apiVersion"`
	Datasources []grafanaDatasource `json:"datasources"`
}

type grafanaDatasource struct {
	Name      string         `json:"name"`
	UID       string         `json:"uid"`
	Type      string         `json:"type"`
	Access    string         `json:"access,omitempty"`
	URL       string         `json:"url"`
	IsDefault bool           `json:"isDefault,omitempty"`
	Editable  bool           `json:"editable,omitempty"`
	JSONData  map[string]any `json:"jsonData,omitempty"`
}

// grafanaProviders is a dashboard provisioning file.
type grafanaProviders struct {
	APIVersion int               `json:"apiVersion"`
	Providers  []grafanaProvider `json:"providers"`
}

type grafanaProvider struct {
	Name                  string `json:"name"`
	Type                  string `json:"type"`
	OrgID                 int    `json:"orgId,omitempty"`
	Folder                string `json:"folder,omitempty"`
	DisableDeletion       bool   `json:"disableDeletion,omitempty"`
	AllowUIUpdates        bool   `json:"allowUiUpdates,omitempty"`
	UpdateIntervalSeconds int    `json:"updateIntervalSeconds,omitempty"`
	Options               struct {
		Path                      string `json:"path"`
		FoldersFromFilesStructure bool   `json:"foldersFromFilesStructure,omitempty"`
	} `json:"options"`
}

// yamlFiles returns the .yml and .yaml files of dir.
func yamlFiles(dir string) ([]string, error) {
	var files []string
	for _, pattern := range []string{"*.yml", "*.yaml"} {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			return nil, err
		}
		files = append(files, m...)
	}
	slices.Sort(files)
	return files, nil
}

// checkGrafana checks the Grafana service s: its provisioning is mounted
// where Grafana reads it, its Prometheus data source reaches service prom,
// and its dashboard provider reads the dashboards of deploy/grafana/dashboards,
// which are checked against that data source.
func checkGrafana(pr *problems, s types.ServiceConfig, repo, prom string, metrics Metrics) {
	where := "service " + s.Name
	env := serviceEnv(s)
	checkLoopback(pr, s, grafanaPort)
	if env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" {
		if role := env["GF_AUTH_ANONYMOUS_ORG_ROLE"]; role != "" && role != "Viewer" {
			pr.addf("%s: an anonymous user is %s; want Viewer", where, role)
		}
	}
	v, _ := bindMount(s, filepath.Join(repo, grafanaProvisioning))
	want := grafanaProvisioningPath
	if p := env["GF_PATHS_PROVISIONING"]; p != "" {
		want = p
	}
	if v.Target != want || !v.ReadOnly {
		pr.addf("%s: mounts %s at %s; Grafana reads %s (want it read-only)", where, grafanaProvisioning, v.Target, want)
	}

	uid := checkDatasources(pr, filepath.Join(repo, grafanaProvisioning, "datasources"), prom)
	files, err := yamlFiles(filepath.Join(repo, grafanaProvisioning, "dashboards"))
	if err != nil || len(files) == 0 {
		pr.addf("%s/dashboards: no provisioning file (%v)", grafanaProvisioning, err)
		return
	}
	dashboards := filepath.Join(repo, grafanaDashboards)
	dv, ok := bindMount(s, dashboards)
	if !ok {
		pr.addf("%s: does not mount %s", where, grafanaDashboards)
	}
	for _, f := range files {
		var c grafanaProviders
		if err := readYAML(f, &c); err != nil {
			pr.addf("%v", err)
			continue
		}
		for _, p := range c.Providers {
			if p.Type != "file" || filepath.Clean(p.Options.Path) != filepath.Clean(dv.Target) || !ok {
				pr.addf("%s: provider %q reads %s %s; want the file provider on %s's mount, %s", f, p.Name, p.Type, p.Options.Path, grafanaDashboards, dv.Target)
			}
		}
	}
	if home := env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != "" {
		rel, err := filepath.Rel(dv.Target, home)
		if _, serr := os.Stat(filepath.Join(dashboards, rel)); !ok || err != nil || strings.HasPrefix(rel, "..") || serr != nil {
			pr.addf("%s: GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH=%s is not a dashboard of %s (mounted at %s)", where, home, grafanaDashboards, dv.Target)
		}
	}
	jsons, err := filepath.Glob(filepath.Join(dashboards, "*.json"))
	if err != nil || len(jsons) == 0 {
		pr.addf("%s: no dashboard (%v)", grafanaDashboards, err)
		return
	}
	shown := map[string]bool{}
	for _, f := range jsons {
		checkDashboard(pr, f, uid, metrics, shown)
	}
	for _, m := range dashboardMetrics {
		if !shown[m] {
			pr.addf("%s: no panel shows %s", grafanaDashboards, m)
		}
	}
}

// checkDatasources checks the data source provisioning files of dir: one
// Prometheus data source, with a uid, that reaches service prom on its
// port. It returns that uid.
func checkDatasources(pr *problems, dir, prom string) string {
	files, err := yamlFiles(dir)
	if err != nil || len(files) == 0 {
		pr.addf("%s: no provisioning file (%v)", dir, err)
		return ""
	}
	var found []grafanaDatasource
	for _, f := range files {
		var c grafanaDatasources
		if err := readYAML(f, &c); err != nil {
			pr.addf("%v", err)
			continue
		}
		for _, d := range c.Datasources {
			if d.Type == "prometheus" {
				found = append(found, d)
			}
		}
	}
	if len(found) != 1 {
		pr.addf("%s: %d Prometheus data sources; want one", dir, len(found))
		return ""
	}
	d := found[0]
	if d.UID == "" {
		pr.addf("%s: data source %q has no uid; the dashboards name it by one", dir, d.Name)
	}
	if u, err := url.Parse(d.URL); err != nil || u.Scheme != "http" || u.Host != hostPort(prom, prometheusPort) {
		pr.addf("%s: data source %q: url %s; want http://%s", dir, d.Name, d.URL, hostPort(prom, prometheusPort))
	}
	if d.Access != "" && d.Access != "proxy" {
		pr.addf("%s: data source %q: access %s; want proxy (the browser cannot reach %s)", dir, d.Name, d.Access, prom)
	}
	return d.UID
}

// dashboard is the part of a Grafana dashboard the stack uses; anything
// else is refused.
type dashboard struct {
	UID         string   `json:"uid"`
	Title       string   `json:"title"`
	Description string   `json:"description,omitempty"`
	Tags        []string `json:"tags,omitempty"`
	Timezone    string   `json:"timezone,omitempty"`
	Editable    bool     `json:"editable"`
	Refresh     string   `json:"refresh,omitempty"`
	Time        struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"time"`
	SchemaVersion int     `json:"schemaVersion"`
	Version       int     `json:"version,omitempty"`
	Panels        []panel `json:"panels"`
}

type panel struct {
	ID          int            `json:"id"`
	Type        string         `json:"type"`
	Title       string         `json:"title"`
	Description string         `json:"description,omitempty"`
	Datasource  *datasourceRef `json:"datasource"`
	GridPos     struct {
		X int `json:"x"`
		Y int `json:"y"`
		W int `json:"w"`
		H int `json:"h"`
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit string   `json:"unit,omitempty"`
			Min  *float64 `json:"min,omitempty"`
			Max  *float64 `json:"max,omitempty"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []panelTarget `json:"targets"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panelTarget struct {
	RefID        string         `json:"refId"`
	Datasource   *datasourceRef `json:"datasource,omitempty"`
	Expr         string         `json:"expr"`
	LegendFormat string         `json:"legendFormat,omitempty"`
}

// readDashboard decodes a dashboard's JSON strictly.
func readDashboard(path string) (dashboard, error) {
	var d dashboard
	b, err := os.ReadFile(path)
	if err != nil {
		return d, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return d, fmt.Errorf("%s: %w", path, err)
	}
	if dec.More() {
		return d, fmt.Errorf("%s: data after the dashboard", path)
	}
	return d, nil
}

// checkDashboard checks the dashboard at path against the data source uid
// and the metrics, and adds the series its queries name to shown.
func checkDashboard(pr *problems, path, uid string, metrics Metrics, shown map[string]bool) {
	d, err := readDashboard(path)
	if err != nil {
		pr.addf("%v", err)
		return
	}
	name := filepath.Base(path)
	if d.UID == "" || len(d.UID) > 40 || d.Title == "" {
		pr.addf("%s: uid %q, title %q; want both, the uid at most 40 characters", name, d.UID, d.Title)
	}
	if d.SchemaVersion < minSchemaVersion {
		pr.addf("%s: schemaVersion %d; want at least %d", name, d.SchemaVersion, minSchemaVersion)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		where := fmt.Sprintf("%s: panel %d %q", name, p.ID, p.Title)
		if p.ID <= 0 || ids[p.ID] {
			pr.addf("%s: id %d is not a positive id of its own", where, p.ID)
		}
		ids[p.ID] = true
		if !slices.Contains(panelTypes, p.Type) || p.Title == "" {
			pr.addf("%s: type %q; want a title and one of %v", where, p.Type, panelTypes)
		}
		if g := p.GridPos; g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > gridWidth {
			pr.addf("%s: gridPos %+v is not inside the grid's %d columns", where, g, gridWidth)
		}
		if p.Type == "text" {
			continue
		}
		checkRef(pr, where, p.Datasource, uid, false)
		if len(p.Targets) == 0 {
			pr.addf("%s: no query", where)
		}
		refs := map[string]bool{}
		for _, t := range p.Targets {
			if t.RefID == "" || refs[t.RefID] {
				pr.addf("%s: refId %q is not one of its own", where, t.RefID)
			}
			refs[t.RefID] = true
			checkRef(pr, where+" query "+t.RefID, t.Datasource, uid, true)
			checkQuery(pr, where+" query "+t.RefID, t.Expr, metrics, shown)
		}
	}
}

// checkRef checks that ref names the Prometheus data source uid; a
// target's may be left out, for the panel's.
func checkRef(pr *problems, where string, ref *datasourceRef, uid string, optional bool) {
	if ref == nil && optional {
		return
	}
	if ref == nil || ref.UID != uid || ref.Type != "prometheus" {
		pr.addf("%s: data source %+v; want the provisioned Prometheus, uid %q", where, ref, uid)
	}
}

// checkQuery checks that expr parses as PromQL, that every series it
// selects is one shop exports (or Prometheus writes for a scrape), by
// name, and that every range spans rangeSamples scrapes; it adds the names
// to shown.
func checkQuery(pr *problems, where, expr string, metrics Metrics, shown map[string]bool) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		pr.addf("%s: %q: %v", where, expr, err)
		return
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			switch {
			case n.Name == "":
				pr.addf("%s: %q selects series without naming a metric", where, n.String())
			case !metrics[n.Name] && !slices.Contains(syntheticMetrics, n.Name):
				pr.addf("%s: %s is not a metric shop exports", where, n.Name)
			}
			shown[n.Name] = true
		case *parser.MatrixSelector:
			if min := rangeSamples * scrapeInterval; n.Range < min {
				pr.addf("%s: range [%s] spans fewer than %d scrapes of %s", where, model.Duration(n.Range), rangeSamples, scrapeInterval)
			}
		}
		return nil
	})
}
