package validate

import (
	"errors"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// ErrUnknownKind is an object of a kind the manifests are not expected to
// hold, so not checked: add it to Manifests (and its checks) first.
var ErrUnknownKind = errors.New("validate: unknown kind")

// Manifests are the objects a kustomization renders, each decoded into its
// Kubernetes API type.
type Manifests struct {
	Namespaces  []corev1.Namespace
	ConfigMaps  []corev1.ConfigMap
	Secrets     []corev1.Secret
	Services    []corev1.Service
	Deployments []appsv1.Deployment
	PDBs        []policyv1.PodDisruptionBudget
	Jobs        []batchv1.Job
	Policies    []networkingv1.NetworkPolicy
}

// Render builds the kustomization in dir as `kubectl apply -k` would and
// decodes every object strictly: a field its type does not have (a typo, a
// field at the wrong level, one from another API version) is an error, as
// is a kind Manifests has no place for.
func Render(dir string) (*Manifests, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("validate: kustomize %s: %w", dir, err)
	}
	m := &Manifests{}
	for _, r := range rm.Resources() {
		doc, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("validate: %s %s: %w", r.GetKind(), r.GetName(), err)
		}
		if err := m.add(r.GetApiVersion(), r.GetKind(), doc); errors.Is(err, ErrUnknownKind) {
			return nil, fmt.Errorf("%w (%s)", err, r.GetName())
		} else if err != nil {
			return nil, fmt.Errorf("validate: %s %s: %w", r.GetKind(), r.GetName(), err)
		}
	}
	return m, nil
}

// add decodes doc, an object of kind in apiVersion, into its place.
func (m *Manifests) add(apiVersion, kind string, doc []byte) error {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return decodeInto(doc, &m.Namespaces)
	case "v1 ConfigMap":
		return decodeInto(doc, &m.ConfigMaps)
	case "v1 Secret":
		return decodeInto(doc, &m.Secrets)
	case "v1 Service":
		return decodeInto(doc, &m.Services)
	case "apps/v1 Deployment":
		return decodeInto(doc, &m.Deployments)
	case "policy/v1 PodDisruptionBudget":
		return decodeInto(doc, &m.PDBs)
	case "batch/v1 Job":
		return decodeInto(doc, &m.Jobs)
	case "networking.k8s.io/v1 NetworkPolicy":
		return decodeInto(doc, &m.Policies)
	}
	return fmt.Errorf("%w: %s %s", ErrUnknownKind, apiVersion, kind)
}

// decodeInto decodes doc strictly into a T and appends it to list.
func decodeInto[T any](doc []byte, list *[]T) error {
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		return err
	}
	*list = append(*list, v)
	return nil
}
