package validate_test

import (
	"context"
	"path/filepath"
	"testing"

	"shop/deploy/validate"
)

// metrics reads the metrics shop exports from its source.
func metrics(t *testing.T, repo string) validate.Metrics {
	t.Helper()
	m, err := validate.ReadMetrics(filepath.Join(repo, "cmd/shop"), filepath.Join(repo, "internal"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestReadMetrics(t *testing.T) {
	m := metrics(t, repoDir)
	for _, name := range []string{
		"shop_orders_total",                         // a CounterVec in internal/handler
		"shop_http_request_duration_seconds_bucket", // a histogram's buckets
		"shop_http_request_duration_seconds_count",
		"shop_lock_waiting",                  // a GaugeFunc in cmd/shop
		"shop_cache_hits_total",              // Namespace, Subsystem and a helper's parameter
		"shop_cache_fallbacks_total",         // Namespace, Subsystem and Name
		"shop_dependency_errors_total",       // internal/depmetrics
		"shop_ready",                         // a GaugeFunc in internal/readiness
		"shop_events_oldest_pending_seconds", // a Gauge in cmd/shop
	} {
		if !m[name] {
			t.Errorf("%s not found among shop's metrics", name)
		}
	}
	for _, name := range []string{"shop_http_request_duration_seconds", "hits_total", "shop_cache_name"} {
		if m[name] {
			t.Errorf("%s taken for a series shop exports", name)
		}
	}
	t.Logf("%d series names", len(m))
}

// monitoringFiles are the files a monitoring check reads.
var monitoringFiles = []string{
	"docker-compose.yml",
	"deploy/nginx.conf",
	"deploy/prometheus/prometheus.yml",
	"deploy/prometheus/alerts.yml",
	"deploy/grafana/provisioning/datasources/prometheus.yml",
	"deploy/grafana/provisioning/dashboards/shop.yml",
	"deploy/grafana/dashboards/shop.json",
}

// checkMonitoring loads the compose file of the repository at repo and
// checks its Prometheus and Grafana, and the rest of it.
func checkMonitoring(t *testing.T, repo string, m validate.Metrics) error {
	t.Helper()
	p, err := validate.LoadCompose(context.Background(), filepath.Join(repo, "docker-compose.yml"), composeEnv)
	if err != nil {
		return err
	}
	if err := validate.CheckCompose(p, repo, service(t)); err != nil {
		return err
	}
	return validate.CheckMonitoring(p, repo, service(t), m)
}

// TestMonitoring checks the compose stack's Prometheus, Grafana and the
// dashboard against the replicas and shop's metrics.
func TestMonitoring(t *testing.T) {
	if err := checkMonitoring(t, repo(t), metrics(t, repoDir)); err != nil {
		t.Fatal(err)
	}
}

// TestMonitoringRejectsBrokenCopies breaks a copy of the monitoring files
// in one way per case and expects the validation to reject it, naming the
// problem.
func TestMonitoringRejectsBrokenCopies(t *testing.T) {
	const (
		dc   = "docker-compose.yml"
		prom = "deploy/prometheus/prometheus.yml"
		rule = "deploy/prometheus/alerts.yml"
		ds   = "deploy/grafana/provisioning/datasources/prometheus.yml"
		prov = "deploy/grafana/provisioning/dashboards/shop.yml"
		dash = "deploy/grafana/dashboards/shop.json"
	)
	m := metrics(t, repoDir)
	cases := []struct {
		name  string
		edits []edit
		want  string
	}{
		{"compose: unknown key", []edit{{dc, "    image: prom/prometheus:v3.5.0\n", "    image: prom/prometheus:v3.5.0\n    volume: []\n"}}, "volume"},
		{"prometheus on every interface", []edit{{dc, `ports: ["127.0.0.1:9090:9090"]`, `ports: ["9090:9090"]`}}, `service prometheus: port 9090 is published on ""; want 127.0.0.1 only`},
		{"grafana not published", []edit{{dc, `    ports: ["127.0.0.1:3000:3000"]` + "\n", ""}}, "service grafana: publishes no port 3000"},
		{"grafana anonymous admin", []edit{{dc, "GF_AUTH_ANONYMOUS_ORG_ROLE: Viewer", "GF_AUTH_ANONYMOUS_ORG_ROLE: Admin"}}, "an anonymous user is Admin; want Viewer"},
		{"prometheus config elsewhere", []edit{{dc, ":/etc/prometheus/prometheus.yml:ro", ":/etc/prometheus/shop.yml:ro"}}, "Prometheus reads /etc/prometheus/prometheus.yml"},
		{"prometheus config not mounted", []edit{{dc, "./deploy/prometheus/prometheus.yml:", "./deploy/prometheus/other.yml:"}}, "0 services mount"},
		{"prometheus config typo", []edit{{prom, "    static_configs:\n", "    static_config:\n"}}, `unknown field "static_config"`},
		{"prometheus config bad duration", []edit{{prom, "  scrape_interval: 5s\n", "  scrape_interval: 5 seconds\n"}}, "global scrape_interval"},
		{"scraped too seldom", []edit{{prom, "  scrape_interval: 5s\n", "  scrape_interval: 30s\n"}}, `job "shop": scrapes every 30s; want 5s`},
		{"replica not scraped", []edit{{prom, `, "shop3:9091"`, ""}}, "scrapes [shop1:9091 shop2:9091]; want every shop replica once"},
		{"replica scraped on another port", []edit{{prom, `"shop2:9091"`, `"shop2:9100"`}}, "scrapes [shop1:9091 shop2:9100 shop3:9091]"},
		{"replica scraped on the public port", []edit{{prom, `"shop2:9091"`, `"shop2:8080"`}}, "scrapes [shop1:9091 shop2:8080 shop3:9091]"},
		{"nginx scraped", []edit{{prom, `"shop3:9091"]`, `"shop3:9091", "nginx:8080"]`}}, "scrapes [nginx:8080 shop1:9091"},
		{"replica added, not scraped", []edit{{dc, "  shop3: *shop\n", "  shop3: *shop\n  shop4: *shop\n"}, {dc, " server shop3:8080 max_fails=1 fail_timeout=2s;", " server shop3:8080 max_fails=1 fail_timeout=2s; server shop4:8080 max_fails=1 fail_timeout=2s;"}},
			"want every shop replica once, on the port of its operators' listener (SHOP_ADMIN_ADDR): [shop1:9091 shop2:9091 shop3:9091 shop4:9091]"},
		{"operators' listener elsewhere", []edit{{dc, `SHOP_ADMIN_ADDR: ":9091"`, `SHOP_ADMIN_ADDR: ":9200"`}},
			"want every shop replica once, on the port of its operators' listener (SHOP_ADMIN_ADDR): [shop1:9200 shop2:9200 shop3:9200]"},
		{"operators' listener on the loopback", []edit{{dc, `SHOP_ADMIN_ADDR: ":9091"`, `SHOP_ADMIN_ADDR: "127.0.0.1:9091"`}}, "service shop1: SHOP_ADMIN_ADDR=\"127.0.0.1:9091\""},
		{"operators' listener left at its default", []edit{{dc, `  SHOP_ADMIN_ADDR: ":9091"` + "\n", ""}}, "the operators' listener, which serves /metrics,"},
		{"operators' listener published", []edit{{dc, "  shop3: *shop\n", "  shop3:\n    <<: *shop\n    ports: [\"127.0.0.1:9091:9091\"]\n"}}, "service shop3: publishes port 9091, the operators' listener"},
		{"rules not loaded", []edit{{prom, "rule_files:\n  - /etc/prometheus/alerts.yml\n", ""}}, "rule_files does not load deploy/prometheus/alerts.yml"},
		{"rules loaded from elsewhere", []edit{{prom, "  - /etc/prometheus/alerts.yml\n", "  - /etc/prometheus/rules.yml\n"}}, "service prometheus mounts no file of the repository at /etc/prometheus/rules.yml"},
		{"rules by a pattern", []edit{{prom, "  - /etc/prometheus/alerts.yml\n", "  - /etc/prometheus/*.yml\n"}}, "a pattern; name each rules file"},
		{"rules relative, not mounted there", []edit{{prom, "  - /etc/prometheus/alerts.yml\n", "  - rules/alerts.yml\n"}}, "mounts no file of the repository at /etc/prometheus/rules/alerts.yml"},
		{"rules not mounted", []edit{{dc, "      - ./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro\n", ""}}, "mounts no file of the repository at /etc/prometheus/alerts.yml"},
		{"rules mounted read-write", []edit{{dc, ":/etc/prometheus/alerts.yml:ro", ":/etc/prometheus/alerts.yml"}}, "mounts deploy/prometheus/alerts.yml there read-write; want it read-only"},
		{"rules typo", []edit{{rule, "shop-money\n    rules:\n", "shop-money\n    rule:\n"}}, `unknown field "rule"`},
		{"recording rule", []edit{{rule, "      - alert: ShopRefundFailed\n", "      - record: shop:refunds_failed\n"}}, `unknown field "record"`},
		{"group without a name", []edit{{rule, "  - name: shop-money\n", "  - name: \"\"\n"}}, `group "": a group needs a name of its own`},
		{"alert query does not parse", []edit{{rule, `increase(shop_refunds_total{state="failed"}[15m]) > 0`, `increase(shop_refunds_total{state="failed"}[15m] > 0`}}, `alert "ShopRefundFailed": "increase(`},
		{"alert on a metric shop does not export", []edit{{rule, `increase(shop_refunds_total{state="failed"}`, `increase(shop_refund_total{state="failed"}`}}, "shop_refund_total is not a metric shop exports"},
		{"alert range too short", []edit{{rule, `{state="failed"}[15m]`, `{state="failed"}[10s]`}}, `alert "ShopRefundFailed": range [10s] spans fewer than 4 scrapes of 5s`},
		{"failed refunds not alerted", []edit{{rule, `increase(shop_refunds_total{state="failed"}[15m]) > 0`, `increase(shop_orders_busy_total[15m]) > 100`}}, "deploy/prometheus/alerts.yml: no alert watches shop_refunds_total"},
		{"alert for not a duration", []edit{{rule, "[15m]) > 0\n        labels:\n", "[15m]) > 0\n        for: soon\n        labels:\n"}}, `alert "ShopRefundFailed": for: `},
		{"alert without summary", []edit{{rule, "          summary: \"A refund", "          title: \"A refund"}}, "no summary annotation"},
		{"lapsed reservations not alerted", []edit{{rule, "max(shop_oldest_lapsed_reservation_seconds) > 600", "max(shop_lock_waiting) > 600"}}, "deploy/prometheus/alerts.yml: no alert watches shop_oldest_lapsed_reservation_seconds"},
		{"undelivered events not alerted", []edit{{rule, "max(shop_events_oldest_pending_seconds) > 600", "max(shop_events_pending) > 1000"}}, "deploy/prometheus/alerts.yml: no alert watches shop_events_oldest_pending_seconds"},
		{"dead events not alerted", []edit{{rule, "max(shop_events_dead) > 0", "max(shop_lock_waiting) > 0"}}, "deploy/prometheus/alerts.yml: no alert watches shop_events_dead"},
		{"alert template typo", []edit{{rule, "{{ $labels.instance }}", "{{ $label.instance }}"}}, `annotation summary: template: alert:1: undefined variable "$label"`},
		{"alert template unknown function", []edit{{rule, "{{ $labels.instance }}", "{{ $labels.instance | humanise }}"}}, `function "humanise" not defined`},
		{"metrics path", []edit{{prom, "metrics_path: /metrics", "metrics_path: /api/v1/metrics"}}, "metrics_path /api/v1/metrics"},
		{"provisioning elsewhere", []edit{{dc, ":/etc/grafana/provisioning:ro", ":/etc/grafana/prov:ro"}}, "Grafana reads /etc/grafana/provisioning"},
		{"datasource typo", []edit{{ds, "    isDefault: true\n", "    default: true\n"}}, `unknown field "default"`},
		{"datasource on another host", []edit{{ds, "url: http://prometheus:9090", "url: http://localhost:9090"}}, "url http://localhost:9090; want http://prometheus:9090"},
		{"datasource without uid", []edit{{ds, "    uid: shop-prometheus\n", ""}}, `data source "Prometheus" has no uid`},
		{"datasource uid changed", []edit{{ds, "uid: shop-prometheus", "uid: prom"}}, `want the provisioned Prometheus, uid "prom"`},
		{"provider on another path", []edit{{prov, "path: /var/lib/grafana/dashboards", "path: /etc/grafana/dashboards"}}, `provider "shop" reads file /etc/grafana/dashboards`},
		{"dashboards not mounted", []edit{{dc, "      - ./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro\n", ""}}, "service grafana: does not mount deploy/grafana/dashboards"},
		{"provider typo", []edit{{prov, "    disableDeletion: true\n", "    disableDeletions: true\n"}}, `unknown field "disableDeletions"`},
		{"home dashboard missing", []edit{{dc, "/var/lib/grafana/dashboards/shop.json", "/var/lib/grafana/dashboards/home.json"}}, "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH=/var/lib/grafana/dashboards/home.json is not a dashboard"},
		{"dashboard not JSON", []edit{{dash, `"uid": "shop",`, `"uid": "shop"`}}, "invalid character"},
		{"dashboard unknown key", []edit{{dash, `"schemaVersion": 39,`, `"schemaVersion": 39, "panel": [],`}}, `unknown field "panel"`},
		{"dashboard without uid", []edit{{dash, `"uid": "shop",`, `"uid": "",`}}, `uid "", title "shop"`},
		{"old schema", []edit{{dash, `"schemaVersion": 39,`, `"schemaVersion": 16,`}}, "schemaVersion 16; want at least 36"},
		{"panel id twice", []edit{{dash, `"id": 2,`, `"id": 1,`}}, `panel 1 "Busy orders/s by cause": id 1 is not a positive id of its own`},
		{"unknown panel type", []edit{{dash, `"id": 3,
      "type": "timeseries",`, `"id": 3,
      "type": "graph",`}}, `type "graph"`},
		{"panel off the grid", []edit{{dash, `"x": 12,
        "y": 0,`, `"x": 20,
        "y": 0,`}}, "is not inside the grid's 24 columns"},
		{"panel on another data source", []edit{{dash, `"title": "Orders/s by result",
      "description": "Order attempts per second, by outcome: created, replayed, or the error code (sold_out, already_ordered, busy, …).",
      "datasource": {
        "type": "prometheus",
        "uid": "shop-prometheus"`, `"title": "Orders/s by result",
      "description": "Order attempts per second, by outcome: created, replayed, or the error code (sold_out, already_ordered, busy, …).",
      "datasource": {
        "type": "prometheus",
        "uid": "other"`}}, `panel 1 "Orders/s by result": data source &{Type:prometheus UID:other}`},
		{"query does not parse", []edit{{dash, "sum by (result) (rate(shop_orders_total[1m]))", "sum by (result) (rate(shop_orders_total[1m])"}}, `query A: "sum by (result) (rate(shop_orders_total[1m])"`},
		{"query type error", []edit{{dash, "sum by (result) (rate(shop_orders_total[1m]))", "sum by (result) (rate(shop_orders_total))"}}, "expected type range vector"},
		{"metric shop does not export", []edit{{dash, "sum by (cause) (rate(shop_orders_busy_total[1m]))", "sum by (cause) (rate(shop_order_busy_total[1m]))"}}, "shop_order_busy_total is not a metric shop exports"},
		{"histogram without _bucket", []edit{{dash, `histogram_quantile(0.5, sum by (le) (rate(shop_http_request_duration_seconds_bucket{method=\"POST\"`, `histogram_quantile(0.5, sum by (le) (rate(shop_http_request_duration_seconds{method=\"POST\"`}}, "shop_http_request_duration_seconds is not a metric shop exports"},
		{"metric by __name__", []edit{{dash, "sum by (instance) (shop_lock_waiting)", `sum by (instance) ({__name__=\"shop_lock_waiting\"})`}}, "selects series without naming a metric"},
		{"range too short", []edit{{dash, "sum(rate(shop_lock_wakeups_total[1m]))", "sum(rate(shop_lock_wakeups_total[10s]))"}}, "range [10s] spans fewer than 4 scrapes of 5s"},
		{"dependency errors not shown", []edit{{dash, "sum by (dependency) (rate(shop_dependency_errors_total[1m]))", "sum(rate(shop_cache_fallbacks_total[1m]))"}}, "no panel shows shop_dependency_errors_total"},
		{"events not shown", []edit{{dash, "max(shop_events_oldest_pending_seconds)", "max(shop_events_pending)"}}, "no panel shows shop_events_oldest_pending_seconds"},
		{"event deliveries not shown", []edit{{dash, "sum by (result) (rate(shop_events_deliveries_total[1m]))", "sum(rate(shop_orders_total[1m]))"}}, "no panel shows shop_events_deliveries_total"},
		{"refId twice", []edit{{dash, `"refId": "B",
          "datasource": {
            "type": "prometheus",
            "uid": "shop-prometheus"
          },
          "expr": "sum(rate(shop_lock_wakeups_total[1m]))"`, `"refId": "A",
          "datasource": {
            "type": "prometheus",
            "uid": "shop-prometheus"
          },
          "expr": "sum(rate(shop_lock_wakeups_total[1m]))"`}}, `refId "A" is not one of its own`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := brokenCopy(t, repo(t), monitoringFiles, tc.edits)
			wantRejected(t, checkMonitoring(t, dir, m), tc.want)
		})
	}
}
