package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Objects decodes a stream of YAML documents (as helm template or a
// manifest file writes them) into objects, skipping empty documents.
func Objects(yamlDocs []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(yamlDocs), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("kubetest: decoding manifests: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// Applier server-side-applies objects, finding each kind's resource by
// discovery (so a CRD applied just before is found once it is served).
type Applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// NewApplier returns an Applier acting as cfg's identity.
func NewApplier(cfg *rest.Config) (*Applier, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// Apply applies every object in order; namespaced objects without a
// namespace go to ns. A kind not yet served (a CRD just created) is
// retried for up to 30 s.
func (a *Applier) Apply(ctx context.Context, ns string, objs ...*unstructured.Unstructured) error {
	for _, o := range objs {
		if err := Poll(ctx, 30*time.Second, func() error { return a.apply(ctx, ns, o) }); err != nil {
			return fmt.Errorf("kubetest: applying %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}

func (a *Applier) apply(ctx context.Context, ns string, o *unstructured.Unstructured) error {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		a.mapper.Reset()
		return err
	}
	if err != nil {
		return err
	}
	var r dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			o.SetNamespace(ns)
		}
		r = a.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	body, err := o.MarshalJSON()
	if err != nil {
		return err
	}
	force := true
	_, err = r.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "kubetest", Force: &force})
	if apierrors.IsNotFound(err) && o.GetKind() != "Namespace" {
		return err // its namespace may be on its way
	}
	return err
}
