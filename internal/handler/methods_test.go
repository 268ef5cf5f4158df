package handler_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/handler"
)

// series returns the series of the metric name in reg, each with its labels
// and value (a counter's, or a histogram's count).
func series(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string // name=value, in the order Gather sorts them
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out[strings.Join(labels, ",")] = m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return out
}

// total is the sum of series' values.
func total(series map[string]float64) float64 {
	var n float64
	for _, v := range series {
		n += v
	}
	return n
}

// Any token is a method; each made-up one must not become a series of its
// own.
func TestMadeUpMethodsDoNotGrowMetrics(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	reg := prometheus.NewRegistry()
	srv := serve(t, both(handler.New(handler.Deps{Registry: reg}, handler.Settings{})))
	for i := range 500 {
		for _, path := range []string{"/api/v1/orders", "/nothing"} {
			req, err := http.NewRequest(fmt.Sprintf("M%03d", i), srv.URL+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}
	for _, name := range []string{"shop_http_requests_total", "shop_http_request_duration_seconds"} {
		s := series(t, reg, name)
		var requests float64
		for _, v := range s {
			requests += v
		}
		if len(s) > 4 || requests != 1000 {
			t.Errorf("%s: %d series over %v requests, want at most 4 over 1000", name, len(s), requests)
		}
	}
	if s := series(t, reg, "shop_http_requests_total"); s["code=405,method=other,route=unmatched"] != 500 {
		t.Errorf("made-up methods on a route: %v under method=other, want 500", s["code=405,method=other,route=unmatched"])
	}
}
