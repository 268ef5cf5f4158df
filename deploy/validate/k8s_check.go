package validate

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/hasher"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
	"sigs.k8s.io/yaml"
)

const (
	// imageUID is the user the Dockerfile runs shop as.
	imageUID = 10001
	// defaultGrace is Kubernetes's terminationGracePeriodSeconds when a pod
	// sets none.
	defaultGrace = 30 * time.Second
)

// secretEnv are the settings that carry credentials: from a Secret only.
var secretEnv = []string{"SHOP_MYSQL_DSN", "SHOP_ADMIN_TOKEN", "SHOP_JWT_SECRET",
	"SHOP_PAYMENT_WEBHOOK_SECRET", "SHOP_STRIPE_SECRET_KEY", "SHOP_STRIPE_WEBHOOK_SECRET"}

// requiredEnv are the settings whose defaults are loopback addresses, which
// mean nothing in a pod.
var requiredEnv = []string{"SHOP_MYSQL_DSN", "SHOP_REDIS_ADDR"}

// problems collects what a check finds, so that one run reports all of it.
type problems []error

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Errorf(format, args...)) }

func (p problems) err() error { return errors.Join(p...) }

// CheckK8s checks that the manifests run the service as it expects to be
// run: the probes, the Service and the budget reach the replicas' port and
// pods, the grace period covers the preStop sleep, the drain and the
// shutdown, every SHOP_* setting is one the service reads and credentials
// come from a Secret whose name, like the ConfigMap's, carries the hash of
// its content, the payment provider's secrets are there (checkPayments),
// buyers are authenticated (checkAuth), the proxies in front are trusted
// (checkTrustedProxies), the operators' port is reachable from the
// monitoring namespace alone (checkPolicies), the pods run unprivileged,
// and the setup Job migrates and then seeds an
// empty catalog only, with the replicas' image. It returns every problem
// found, each naming its object.
func CheckK8s(m *Manifests, svc Service) error {
	var p problems
	if len(m.Deployments) != 1 {
		p.addf("want one Deployment, the replicas; found %d", len(m.Deployments))
		return p.err()
	}
	d := m.Deployments[0]
	where := "Deployment " + d.Name
	pod := d.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		p.addf("%s: want one container, shop serve; found %d", where, len(pod.Spec.Containers))
		return p.err()
	}
	c := pod.Spec.Containers[0]
	env := m.checkPodEnv(&p, where, d.Namespace, svc, pod.Spec)
	port, err := svc.listenPort(env)
	if err != nil {
		p.addf("%s: %v", where, err)
		return p.err()
	}
	if !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return int(cp.ContainerPort) == port }) {
		p.addf("%s: container %s declares no port %d, the one SHOP_HTTP_ADDR listens on", where, c.Name, port)
	}
	if admin, err := svc.adminPort(env); err != nil {
		p.addf("%s: %v", where, err)
	} else {
		checkAdminPort(&p, where, pod, c, admin, port)
		m.checkPolicies(&p, d.Namespace, pod.Labels, c, admin, port)
	}
	checkProbe(&p, where+": readinessProbe", c.ReadinessProbe, c, "/readyz", port)
	checkProbe(&p, where+": livenessProbe", c.LivenessProbe, c, "/healthz", port)
	checkStop(&p, where, svc, pod.Spec, c, env)
	checkRollout(&p, where, d.Spec.Strategy)
	if mode := env["SHOP_LOCK_MODE"]; (mode == "local" || mode == "none") && d.Spec.Replicas != nil && *d.Spec.Replicas > 1 {
		p.addf("%s: SHOP_LOCK_MODE=%s on several replicas oversells: only the Redis locks hold across processes", where, mode)
	}
	checkPodSecurity(&p, where, pod.Spec)
	checkGoMemLimit(&p, where, c, env)
	svc.checkPayments(&p, where, env)
	checkAuth(&p, where, env)
	checkTrustedProxies(&p, where, env, nil)

	m.checkGeneratedNames(&p)
	m.checkServices(&p, pod.Labels, c, port)
	m.checkPDBs(&p, pod.Labels, d.Spec.Replicas)
	m.checkJobs(&p, svc, c.Image)
	return p.err()
}

// envVar is one variable of a container's environment: its value and
// where it comes from ("ConfigMap x", "Secret y", "literal", "the pod").
type envVar struct{ value, from string }

// containerEnv returns the environment c gets in namespace ns: envFrom's
// ConfigMaps and Secrets in order, then env, each later one replacing an
// earlier one of the same name. A ConfigMap, a Secret or a key that is not
// in the manifests is a problem (the pod would not start).
func (m *Manifests) containerEnv(p *problems, where, ns string, c corev1.Container) map[string]envVar {
	env := map[string]envVar{}
	for _, src := range c.EnvFrom {
		switch {
		case src.ConfigMapRef != nil:
			cm := m.configMap(ns, src.ConfigMapRef.Name)
			if cm == nil {
				p.addf("%s: envFrom: no ConfigMap %s in the manifests", where, src.ConfigMapRef.Name)
				continue
			}
			for k, v := range cm.Data {
				env[src.Prefix+k] = envVar{v, "ConfigMap " + cm.Name}
			}
		case src.SecretRef != nil:
			s := m.secret(ns, src.SecretRef.Name)
			if s == nil {
				p.addf("%s: envFrom: no Secret %s in the manifests", where, src.SecretRef.Name)
				continue
			}
			for k, v := range secretData(s) {
				env[src.Prefix+k] = envVar{v, "Secret " + s.Name}
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = envVar{e.Value, "literal"}
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := m.configMap(ns, ref.Name)
			v, ok := "", cm != nil
			if ok {
				v, ok = cm.Data[ref.Key]
			}
			if !ok {
				p.addf("%s: env %s: no key %s in a ConfigMap %s of the manifests", where, e.Name, ref.Key, ref.Name)
			}
			env[e.Name] = envVar{v, "ConfigMap " + ref.Name}
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s := m.secret(ns, ref.Name)
			v, ok := "", s != nil
			if ok {
				v, ok = secretData(s)[ref.Key]
			}
			if !ok {
				p.addf("%s: env %s: no key %s in a Secret %s of the manifests", where, e.Name, ref.Key, ref.Name)
			}
			env[e.Name] = envVar{v, "Secret " + ref.Name}
		default:
			env[e.Name] = envVar{"", "the pod"}
		}
	}
	return env
}

// checkPodEnv checks the environment and the resources of every container
// of a pod and returns the first main container's environment, as plain
// values.
func (m *Manifests) checkPodEnv(p *problems, where, ns string, svc Service, pod corev1.PodSpec) map[string]string {
	var first map[string]string
	for i, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		cw := where + ": container " + c.Name
		env := m.containerEnv(p, cw, ns, c)
		values := map[string]string{}
		for k, v := range env {
			values[k] = v.value
		}
		if unknown := svc.unknownEnv(values); len(unknown) > 0 {
			p.addf("%s: %s: not a setting shop reads (cmd/shop)", cw, strings.Join(unknown, ", "))
		}
		for _, name := range secretEnv {
			if v, ok := env[name]; ok && !strings.HasPrefix(v.from, "Secret ") {
				p.addf("%s: %s comes from %s; it carries a credential and must come from a Secret", cw, name, v.from)
			}
		}
		for _, name := range requiredEnv {
			if _, ok := env[name]; !ok {
				p.addf("%s: %s is not set; its default is a loopback address, no server in a pod", cw, name)
			}
		}
		checkResources(p, cw, c)
		if i == len(pod.InitContainers) {
			first = values
		}
	}
	return first
}

func (m *Manifests) configMap(ns, name string) *corev1.ConfigMap {
	for i, cm := range m.ConfigMaps {
		if cm.Namespace == ns && cm.Name == name {
			return &m.ConfigMaps[i]
		}
	}
	return nil
}

func (m *Manifests) secret(ns, name string) *corev1.Secret {
	for i, s := range m.Secrets {
		if s.Namespace == ns && s.Name == name {
			return &m.Secrets[i]
		}
	}
	return nil
}

// secretData returns a Secret's keys and values, stringData's over data's,
// as the API server merges them.
func secretData(s *corev1.Secret) map[string]string {
	out := map[string]string{}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	for k, v := range s.StringData {
		out[k] = v
	}
	return out
}

// checkGeneratedNames checks that every ConfigMap and Secret is named
// with the hash of its content, as kustomize's generators name them: a
// changed setting, password or token then renames it, and kustomize
// writes the new name into the pods that read it, which rolls them
// (settings are read at start-up only). That the pods read exactly those
// names is checked with their environment (containerEnv): a reference that
// kustomize did not rewrite names no object of the manifests.
func (m *Manifests) checkGeneratedNames(p *problems) {
	for _, cm := range m.ConfigMaps {
		checkHashedName(p, "ConfigMap", cm.Name, &cm)
	}
	for _, s := range m.Secrets {
		checkHashedName(p, "Secret", s.Name, &s)
	}
}

// hashLen is the length of the hash kustomize appends to a generated name.
const hashLen = 10

// checkHashedName checks that name, obj's, ends in the hash kustomize's
// generators compute of obj's kind, type, data and name before the hash.
func checkHashedName(p *problems, kind, name string, obj any) {
	where := kind + " " + name
	base, suffix, ok := cutLast(name, "-")
	if !ok || len(suffix) != hashLen {
		base = name
	}
	want, err := hashedName(kind, base, obj)
	if err != nil {
		p.addf("%s: %v", where, err)
		return
	}
	if name != want {
		p.addf("%s: the name does not end in the hash of its content, as a kustomize generator names it (%s): "+
			"a changed value would not roll the pods that read it", where, want)
	}
}

// hashedName returns the name a kustomize generator gives obj, of kind,
// generated as base.
func hashedName(kind, base string, obj any) (string, error) {
	doc, err := yaml.Marshal(obj)
	if err != nil {
		return "", err
	}
	node, err := kyaml.Parse(string(doc))
	if err != nil {
		return "", err
	}
	node.SetKind(kind)
	if err := node.SetName(base); err != nil {
		return "", err
	}
	h, err := new(hasher.Hasher).Hash(node)
	if err != nil {
		return "", err
	}
	return base + "-" + h, nil
}

// cutLast slices s around the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// containerPort resolves a port given by number or by name in c.
func containerPort(c corev1.Container, port intstr.IntOrString) (int, bool) {
	if port.Type == intstr.Int {
		return int(port.IntVal), true
	}
	for _, cp := range c.Ports {
		if cp.Name == port.StrVal {
			return int(cp.ContainerPort), true
		}
	}
	return 0, false
}

// checkProbe checks that probe is a GET of path on the port shop listens on.
func checkProbe(p *problems, where string, probe *corev1.Probe, c corev1.Container, path string, port int) {
	if probe == nil || probe.HTTPGet == nil {
		p.addf("%s: want an httpGet of %s", where, path)
		return
	}
	if probe.HTTPGet.Path != path {
		p.addf("%s: path %q; want %s", where, probe.HTTPGet.Path, path)
	}
	if got, ok := containerPort(c, probe.HTTPGet.Port); !ok || got != port {
		p.addf("%s: port %s is not %d, the one shop listens on", where, probe.HTTPGet.Port.String(), port)
	}
}

// adminPortName is the name of the container port of the operators'
// listener.
const adminPortName = "admin"

// checkAdminPort checks the operators' listener of a pod whose container
// c listens on port and on admin for /metrics and the admin API: admin is
// another port, declared as the port named admin, and the pod's
// prometheus.io annotations send Prometheus's scrapes there (the public
// port answers /metrics with 404). That no Service sends to it is
// checkServices's.
func checkAdminPort(p *problems, where string, pod corev1.PodTemplateSpec, c corev1.Container, admin, port int) {
	if admin == port {
		p.addf("%s: SHOP_ADMIN_ADDR and SHOP_HTTP_ADDR share port %d: the operators' listener must be apart from the public one", where, port)
	}
	if got, ok := containerPort(c, intstr.FromString(adminPortName)); !ok || got != admin {
		p.addf("%s: container %s: want a port named %s, %d, the one SHOP_ADMIN_ADDR listens on", where, c.Name, adminPortName, admin)
	}
	a := pod.Annotations
	if a["prometheus.io/scrape"] != "true" {
		p.addf("%s: the pod template's annotation prometheus.io/scrape is %q; want \"true\"", where, a["prometheus.io/scrape"])
	}
	if got := a["prometheus.io/port"]; got != strconv.Itoa(admin) {
		p.addf("%s: the pod template's annotation prometheus.io/port is %q; want %d, SHOP_ADMIN_ADDR's port (/metrics answers 404 on the public one)", where, got, admin)
	}
	if path := a["prometheus.io/path"]; path != "" && path != "/metrics" {
		p.addf("%s: the pod template's annotation prometheus.io/path is %q; shop serves /metrics", where, path)
	}
}

// checkStop checks the preStop sleep and that the grace period covers it,
// the drain and the shutdown: past the grace period the kubelet kills the
// container, in-flight orders included.
func checkStop(p *problems, where string, svc Service, pod corev1.PodSpec, c corev1.Container, env map[string]string) {
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds <= 0 {
		p.addf("%s: want a preStop sleep: shop closes its listener on SIGTERM, while the cluster may still route connections to the pod", where)
		return
	}
	sleep := time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	drain, err := svc.drain(env)
	if err != nil {
		p.addf("%s: %v", where, err)
		return
	}
	grace := defaultGrace
	if pod.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	}
	if need := sleep + drain + svc.Shutdown; grace < need {
		p.addf("%s: terminationGracePeriodSeconds %s is less than preStop sleep %s + SHOP_DRAIN %s + shutdown %s = %s",
			where, grace, sleep, drain, svc.Shutdown, need)
	}
}

// checkRollout checks that a rollout never lowers the number of ready
// replicas: a new pod is ready before an old one stops.
func checkRollout(p *problems, where string, s appsv1.DeploymentStrategy) {
	ru := s.RollingUpdate
	if s.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable == nil || ru.MaxSurge == nil {
		p.addf("%s: want a RollingUpdate strategy with maxUnavailable 0 and a maxSurge", where)
		return
	}
	if ru.MaxUnavailable.String() != "0" && ru.MaxUnavailable.String() != "0%" {
		p.addf("%s: rollingUpdate.maxUnavailable %s; want 0, so that a rollout keeps every replica serving until its successor is ready", where, ru.MaxUnavailable.String())
	}
	if ru.MaxSurge.String() == "0" || ru.MaxSurge.String() == "0%" {
		p.addf("%s: rollingUpdate.maxSurge 0 with maxUnavailable 0 cannot roll out", where)
	}
}

// checkPodSecurity checks that every container of a pod runs as the
// image's unprivileged user, on a read-only root, unable to gain privileges,
// with no capability.
func checkPodSecurity(p *problems, where string, pod corev1.PodSpec) {
	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		cw := where + ": container " + c.Name
		sc := c.SecurityContext
		if sc == nil {
			p.addf("%s: no securityContext", cw)
			continue
		}
		nonRoot, uid := sc.RunAsNonRoot, sc.RunAsUser
		if nonRoot == nil {
			nonRoot = psc.RunAsNonRoot
		}
		if uid == nil {
			uid = psc.RunAsUser
		}
		if nonRoot == nil || !*nonRoot {
			p.addf("%s: want runAsNonRoot", cw)
		}
		if uid == nil || *uid != imageUID {
			p.addf("%s: want runAsUser %d, the Dockerfile's user", cw, imageUID)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			p.addf("%s: want readOnlyRootFilesystem", cw)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			p.addf("%s: want allowPrivilegeEscalation: false", cw)
		}
		if sc.Privileged != nil && *sc.Privileged {
			p.addf("%s: privileged", cw)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			p.addf("%s: want capabilities: drop ALL, add none", cw)
		}
	}
}

// checkResources checks that c requests and is limited in CPU and memory.
func checkResources(p *problems, where string, c corev1.Container) {
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[name]; !ok {
			p.addf("%s: no %s request", where, name)
		}
		if _, ok := c.Resources.Limits[name]; !ok {
			p.addf("%s: no %s limit", where, name)
		}
	}
}

// checkGoMemLimit checks that GOMEMLIMIT, when set, is below the memory
// limit: the runtime's soft limit is of no use above the hard one.
func checkGoMemLimit(p *problems, where string, c corev1.Container, env map[string]string) {
	v, ok := env["GOMEMLIMIT"]
	limit, limited := c.Resources.Limits[corev1.ResourceMemory]
	if !ok || !limited || v == "off" {
		return
	}
	// GOMEMLIMIT's units are KiB, MiB…; a quantity's Ki, Mi…
	q, err := resource.ParseQuantity(strings.TrimSuffix(v, "B"))
	if err != nil {
		p.addf("%s: GOMEMLIMIT=%q: %v", where, v, err)
		return
	}
	if q.Cmp(limit) >= 0 {
		p.addf("%s: GOMEMLIMIT %s is not below the memory limit %s", where, v, limit.String())
	}
}

// selects reports whether a Service's selector picks pods labelled so.
func selects(selector, podLabels map[string]string) bool {
	return len(selector) > 0 && labels.SelectorFromSet(selector).Matches(labels.Set(podLabels))
}

// checkServices checks that a Service sends to the replicas' port and that
// no Service selects the Jobs' pods, which serve nothing.
func (m *Manifests) checkServices(p *problems, podLabels map[string]string, c corev1.Container, port int) {
	served := false
	for _, s := range m.Services {
		where := "Service " + s.Name
		for _, j := range m.Jobs {
			if selects(s.Spec.Selector, j.Spec.Template.Labels) {
				p.addf("%s: selects the pods of Job %s, which serve nothing", where, j.Name)
			}
		}
		if !selects(s.Spec.Selector, podLabels) {
			continue
		}
		served = true
		for _, sp := range s.Spec.Ports {
			target := sp.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(sp.Port)
			}
			if got, ok := containerPort(c, target); !ok || got != port {
				p.addf("%s: port %d's targetPort %s is not %d, the one shop listens on", where, sp.Port, target.String(), port)
			}
		}
	}
	if !served {
		p.addf("no Service selects the replicas' pods %v", podLabels)
	}
}

// checkPDBs checks that a PodDisruptionBudget covers the replicas and
// lets a node drain go on, one replica at a time.
func (m *Manifests) checkPDBs(p *problems, podLabels map[string]string, replicas *int32) {
	covered := false
	for _, b := range m.PDBs {
		where := "PodDisruptionBudget " + b.Name
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil {
			p.addf("%s: selector: %v", where, err)
			continue
		}
		if b.Spec.Selector == nil || sel.Empty() || !sel.Matches(labels.Set(podLabels)) {
			continue
		}
		covered = true
		if pol := b.Spec.UnhealthyPodEvictionPolicy; pol != nil && *pol != policyv1.IfHealthyBudget {
			p.addf("%s: unhealthyPodEvictionPolicy %s; want IfHealthyBudget: an outage of the MySQL or Redis every replica shares makes them all unready at once, "+
				"and a node drain then could evict every one", where, *pol)
		}
		n := 1
		if replicas != nil {
			n = int(*replicas)
		}
		switch {
		case b.Spec.MaxUnavailable != nil:
			if v, err := intstr.GetScaledValueFromIntOrPercent(b.Spec.MaxUnavailable, n, true); err != nil || v < 1 {
				p.addf("%s: maxUnavailable %s lets no replica go: a node drain would never end", where, b.Spec.MaxUnavailable.String())
			}
		case b.Spec.MinAvailable != nil:
			if v, err := intstr.GetScaledValueFromIntOrPercent(b.Spec.MinAvailable, n, true); err != nil || v >= n {
				p.addf("%s: minAvailable %s of %d replicas lets no replica go: a node drain would never end", where, b.Spec.MinAvailable.String(), n)
			}
		}
	}
	if !covered {
		p.addf("no PodDisruptionBudget selects the replicas' pods %v", podLabels)
	}
}

// checkJobs checks the Jobs: one of them migrates and then seeds an empty
// catalog only (shop seed --if-empty), every one runs the replicas' image with the replicas' care, is retried a
// bounded number of times and is cleaned up once finished.
func (m *Manifests) checkJobs(p *problems, svc Service, image string) {
	setup := false
	for _, j := range m.Jobs {
		where := "Job " + j.Name
		pod := j.Spec.Template.Spec
		m.checkPodEnv(p, where, j.Namespace, svc, pod)
		checkPodSecurity(p, where, pod)
		for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
			if c.Image != image {
				p.addf("%s: container %s runs %s, not the replicas' image %s", where, c.Name, c.Image, image)
			}
		}
		if j.Spec.BackoffLimit == nil {
			p.addf("%s: no backoffLimit", where)
		}
		if j.Spec.TTLSecondsAfterFinished == nil {
			p.addf("%s: no ttlSecondsAfterFinished", where)
		}
		if pod.RestartPolicy != corev1.RestartPolicyNever && pod.RestartPolicy != corev1.RestartPolicyOnFailure {
			p.addf("%s: restartPolicy %q; a Job's pods need Never or OnFailure", where, pod.RestartPolicy)
		}
		if len(pod.Containers) != 1 {
			p.addf("%s: %d containers; want one: a pod's containers run side by side, its init containers one after the other", where, len(pod.Containers))
		} else if seed, ok := setupSeed(jobSteps(j)); ok {
			setup = true
			if !seedsIfEmpty(seed) {
				p.addf("%s: %s whenever the Job is created again", where, seedWithoutIfEmpty)
			}
		}
	}
	if !setup {
		p.addf("no Job runs shop migrate and then shop seed")
	}
}

// jobSteps returns the shop command lines a Job's pod runs (see shopSteps),
// in order: its init
// containers one after the other, then its container (one: containers run
// side by side). A container without a command runs the image's
// entrypoint, shop, with its args.
func jobSteps(j batchv1.Job) [][]string {
	var steps [][]string
	for _, c := range slices.Concat(j.Spec.Template.Spec.InitContainers, j.Spec.Template.Spec.Containers) {
		argv := slices.Concat(c.Command, c.Args)
		if len(c.Command) == 0 {
			argv = slices.Concat([]string{"shop"}, c.Args)
		}
		steps = append(steps, shopSteps(argv)...)
	}
	return steps
}
