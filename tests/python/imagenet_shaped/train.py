"""A training script in the shape of a typical ImageNet example: an
ImageFolder with PIL transforms, a DataLoader with pin_memory=True, a
model, a few epochs. test_imagenet_shaped.py trains with it as is and after
applying switch.patch (the change a user makes to train through shmcache).
"""
import argparse

import torch
import torchvision.transforms as transforms
from torch import nn
from torchvision import datasets


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)

    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406],
                                     std=[0.229, 0.224, 0.225])
    train_dataset = datasets.ImageFolder(
        args.data,
        transforms.Compose([
            transforms.RandomResizedCrop(16),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]))
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=4, shuffle=True,
        num_workers=args.workers, pin_memory=True)

    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 2))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        seen = 0
        for images, target in train_loader:
            loss = criterion(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += len(target)
        print(f"epoch {epoch} images {seen} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
